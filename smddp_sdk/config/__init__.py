"""Job files and settings: YAML with line/column marks, the precedence merge, and the JSON Schema.

Nothing here imports click: the estimator and other tools can load job files without the CLI.
"""
