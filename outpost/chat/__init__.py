"""Chat beyond plain text: tool calls and reasoning output, independent of the engine and of HTTP.

- `formats.py`: which tool-call format a chat template speaks; reading calls out of answers.
- `tools.py`: checking `tools`/`tool_choice`, the history for the template, the call grammar.
- `reasoning.py`: `<think>` text split off into `reasoning_content`, incrementally.
- `output.py`: answer text -> message fields and streamed deltas.
"""
