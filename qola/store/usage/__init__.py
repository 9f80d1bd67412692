"""Recorded usage: what a workload's processes resolved (:mod:`.records`), merged into a manifest
fragment (:mod:`.fragment`), checked against each module's variant universe and built ahead exactly
(:mod:`.apply`), and compared with a built output (:mod:`.cover`). docs/usage.md."""
