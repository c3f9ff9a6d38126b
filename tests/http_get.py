"""``get(url)``: a plain HTTP GET of a service's endpoint (/livez, /readyz, /metrics) as
(status, body); an error status is an answer, and nothing listening is status 0."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError as error:  # nothing listens yet
        return 0, str(error.reason)
