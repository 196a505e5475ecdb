"""What a run knows and leaves behind: token counting (``tokens``), context budgeting and
compaction (``manager``), JSONL and OpenTelemetry tracing (``tracing``) and trajectory comparison
against golden runs (``golden``)."""
