"""The hooks a test tier with nothing to do in them answers (not a test module)."""

from __future__ import annotations

from collections.abc import Sequence

from kvproto import OffloadingEvent, ReqContext


class QuietHooks:
    """``on_request_finished``, ``on_step_end`` and ``shutdown`` do nothing; ``take_events`` has none."""

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def take_events(self) -> Sequence[OffloadingEvent]:
        return []

    def shutdown(self) -> None:
        pass
