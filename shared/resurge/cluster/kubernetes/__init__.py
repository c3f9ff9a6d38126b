"""The Kubernetes backend (:mod:`.backend`), its controller (:mod:`.controller`), the
API calls both make (:mod:`.api`), the objects they build and read (:mod:`.objects`,
:mod:`.status`) and the watches they follow (:mod:`.watch`). Nothing is imported here:
the official client loads slowly, and only a Kubernetes backend needs it."""
