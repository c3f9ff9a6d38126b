"""The contract's names: NATS subjects, the shared vocabulary (scopes, levels, phases)
and the XID table. Events and the job spec build on them; they import nothing."""
