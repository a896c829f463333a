"""The settings files and the values in them: strict YAML, typed config models, durations, kinds, workloads,
keys and the redaction of secrets."""
