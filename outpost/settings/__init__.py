"""Settings of the server commands in blocks, each field defined once (flag, env variable, help, type).

`fields.py` holds the generator (`setting`, `Block`); the blocks are `EngineSettings` (engine.py),
`HttpSettings` (http.py), `BrokerSettings` and `TracingSettings` (broker.py), and each command's own
block with the table of which command takes which (commands.py). This package imports no engine,
API or cluster code: the commands' composition roots (outpost/commands) turn blocks into servers.
"""

from outpost.settings.broker import BrokerSettings, TracingSettings
from outpost.settings.commands import (
    COMMANDS,
    GatewaySettings,
    ServeSettings,
    WorkerSettings,
    add_command_flags,
)
from outpost.settings.engine import EngineSettings
from outpost.settings.fields import Block, Flag, setting
from outpost.settings.http import HttpSettings

__all__ = [
    "COMMANDS",
    "Block",
    "BrokerSettings",
    "EngineSettings",
    "Flag",
    "GatewaySettings",
    "HttpSettings",
    "ServeSettings",
    "TracingSettings",
    "WorkerSettings",
    "add_command_flags",
    "setting",
]
