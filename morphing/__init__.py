"""The morphing core: pure decisions about layouts, with no I/O, no torch and no grpc.

Layouts under a fixed global batch (:mod:`morphing.layout`), calibration profiles
(:mod:`morphing.profile`), per-stage costs and balanced partitioning (:mod:`morphing.stages`), the
pipeline-schedule simulator (:mod:`morphing.simulator`), the planner (:mod:`morphing.planner`) and
the morph policy (:mod:`morphing.policy`).
"""
