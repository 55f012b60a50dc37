"""The debugger: a stepping engine (Session), its front end (CommandInterpreter), stops."""
from .breakpoints import (Breakpoint, BreakpointTable, LineBreakpoint, NanCatchpoint,
                          NodeBreakpoint, TokenBreakpoint, Watchpoint)
from .commands import Command, CommandInterpreter, Result
from .history import History
from .session import Goal, Session
from .snapshot import Location, Snapshot, Stop, StopReason, capture

__all__ = ["Breakpoint", "BreakpointTable", "LineBreakpoint", "NanCatchpoint", "NodeBreakpoint",
           "TokenBreakpoint", "Watchpoint", "Command", "CommandInterpreter", "Result", "History",
           "Goal", "Session", "Location", "Snapshot", "Stop", "StopReason", "capture"]
