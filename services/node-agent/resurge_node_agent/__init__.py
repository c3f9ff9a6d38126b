"""resurge node agent: launches and supervises one replica's workers.

``launch`` mode (one per replica) waits for Assign commands, starts the workers with
torchrun's environment, streams their output and exits as events, and obeys Stop.
"""
