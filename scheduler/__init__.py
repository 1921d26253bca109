"""The cluster's policy: how its GPUs serve several jobs over time, against deadlines and cost.

Pure (no I/O, no torch, no grpc; an import-linter contract says so): the controller's core and
``spotmorph simulate`` call it with what they observed and act on what it returns.
"""
