"""The agent–trainer contract: everything the two sides of a process boundary must spell the same way.

How a trainer is started (:mod:`.arguments`), where its files are (:mod:`.files`), what it reports
(:mod:`.events`) and how it ends (:mod:`.exit_codes`). The agent, ``spotmorph train``, the trainer,
the demo, the benchmarks and the tests all use these; none of them spells a path, a flag or an event
name itself. Torch-free (checked by import-linter), so the agent never pays for importing torch.
"""

from worker_agent.contract.arguments import (
    GLOO_SOCKET,
    NCCL_SOCKET,
    TRAINER_MODULE,
    WARM_MODULE,
    CommittedCheckpoint,
    TrainerArguments,
    WarmArguments,
    WarmAssignment,
)
from worker_agent.contract.events import (
    CheckpointLoaded,
    CheckpointSkipped,
    CheckpointWritten,
    CollectiveFailed,
    EvaluationCompleted,
    FailureKind,
    HandOffFailed,
    HeldStateSkipped,
    ProgressEvent,
    ProgressLineError,
    ProgressReader,
    ProgressRecord,
    SalvageWritten,
    StepCompleted,
    TrainerFailed,
    TrainerStarted,
    TrainingFinished,
    TrainingStopped,
    events_of,
    parse_progress_line,
    progress_line,
    read_progress,
)
from worker_agent.contract.exit_codes import ExitCode
from worker_agent.contract.files import AgentWorkDir, ControlDir, GenerationDir, Lease, TrainersDir, WarmSpool
from worker_agent.contract.salvage import SalvageOrder

__all__ = [
    "GLOO_SOCKET",
    "NCCL_SOCKET",
    "TRAINER_MODULE",
    "WARM_MODULE",
    "AgentWorkDir",
    "CheckpointLoaded",
    "CheckpointSkipped",
    "CheckpointWritten",
    "CollectiveFailed",
    "CommittedCheckpoint",
    "ControlDir",
    "EvaluationCompleted",
    "ExitCode",
    "FailureKind",
    "GenerationDir",
    "HandOffFailed",
    "HeldStateSkipped",
    "Lease",
    "ProgressEvent",
    "ProgressLineError",
    "ProgressReader",
    "ProgressRecord",
    "SalvageOrder",
    "SalvageWritten",
    "StepCompleted",
    "TrainerArguments",
    "TrainerFailed",
    "TrainerStarted",
    "TrainersDir",
    "TrainingFinished",
    "TrainingStopped",
    "WarmArguments",
    "WarmAssignment",
    "WarmSpool",
    "events_of",
    "parse_progress_line",
    "progress_line",
    "read_progress",
]
