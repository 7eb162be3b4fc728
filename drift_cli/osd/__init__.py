"""Online speculative decoding (OSD): the gradient-based online baseline.

`config`  the settings (one dataclass, defaults in one place)
`buffer`  the replay buffer filled from verification feedback (the target is never re-run)
`trainer` packing buffered contexts into a batch and the AdamW update of the draft copy
The policy that ties them into the engine is `drift_cli.methods.osd.OnlineDistillation`.
"""
