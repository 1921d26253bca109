"""What a step computes with, layout-free: batches and their loss weights, the job's dtype and data order, the
device and autocast, layout-free dropout (eager and compiled), exact mode's fixed-point sums, fp16's loss scale
and the stage's gradient norms. Imports no other part of the runtime (errors aside)."""
