"""Server-Sent Events, decoded line by line (the WHATWG rules the kernel's
streams follow: ``event``, ``id``, multi-line ``data``, comments)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


@dataclass
class SseEvent:
    """One dispatched event: its name (``message`` when unnamed), its data
    and the last id the stream set."""

    event: str
    data: str
    id: Optional[str]


class SseDecoder:
    """Feed it the stream's lines (without their line ends); it returns an
    event each time a blank line completes one."""

    def __init__(self) -> None:
        self.last_id: Optional[str] = None
        self._event = ""
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[SseEvent]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None

    def _dispatch(self) -> Optional[SseEvent]:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SseEvent(event or "message", "\n".join(data), self.last_id)


def run_event(event: SseEvent) -> Dict[str, Any]:
    """A frame of a run's events stream: the event, as JSON."""
    return json.loads(event.data)


def console_frame(event: SseEvent) -> Dict[str, Any]:
    """A frame of an op's console: ``output`` (offset, text) or ``done``."""
    return {"event": event.event, "id": event.id, "data": json.loads(event.data)}
