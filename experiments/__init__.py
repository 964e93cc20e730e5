"""Probes of past research questions, kept so that their findings can be reproduced. Each module runs from the
repository root as ``python -m experiments.<name>``; experiments/README.md says what each asked and found."""
