"""A plain script (it never imports resurge) that prints a few steps, then hangs in Python:
alive, running Python code, silent. Only a log rule can tell."""

import time

for step in range(1, 4):
    print(f"step {step}", flush=True)
print("hanging", flush=True)
while True:
    time.sleep(0.05)
