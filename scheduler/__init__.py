"""When things happen: timers and the job queue (built with the controller issue)."""
