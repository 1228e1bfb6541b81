"""A response's function calls: the `<tool_call>` text in its stream becomes function_call items and their events.
Through chat's `ToolCallParser`, words go back to the response's message and each call becomes an output item,
announced once its name is known, its arguments streamed as `response.function_call_arguments.delta`. A call
whose arguments are not JSON (cut off by the length limit or a cancel) ends `incomplete`, left out of the next
prompt."""

from __future__ import annotations

import json
from collections.abc import Callable

from voice_gateway.openai.tool_parser import Arguments, CallStart, Content, ParsedCall, Piece, ToolCallParser
from voice_gateway.realtime.conversation import Item, new_item_id
from voice_gateway.realtime.events import (
    ConversationItemDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    OutputItemDone,
)
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.sender import EventSender

# puts an output item in the response and the conversation and announces it; returns its output_index
Announce = Callable[[Item, FunctionCallItem], int]


class ResponseCalls:
    """Owns one response's tool-call parser and the function_call items it finds (`say`: the words between)."""

    def __init__(self, response_id: str, sender: EventSender, announce: Announce, say: Callable[[str], None]) -> None:
        self.response_id = response_id
        self.sender = sender
        self.announce = announce
        self.say = say
        self.parser = ToolCallParser()
        self._open: dict[int, tuple[Item, int]] = {}  # parser's call index -> (item, output_index), until done
        self._done: set[str] = set()  # call ids whose items are done

    def feed(self, text: str) -> None:
        self._take(self.parser.feed(text))

    def close(self) -> None:
        """The reply ended: what the parser held back, and every call it found, done."""
        self._take(self.parser.close())

    def abandon(self) -> None:
        """The reply stopped (cancelled or failed): the calls still being written end incomplete."""
        for item, index in list(self._open.values()):
            self._finish(item, index, item.arguments)

    def _take(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            self._finish_parsed()  # a call that ended before this piece is done before it
            if isinstance(piece, Content):
                self.say(piece.text)
            elif isinstance(piece, CallStart):
                item = Item(new_item_id(), "assistant", status="in_progress", kind="function_call",
                            call_id=piece.id, name=piece.name)
                shown = FunctionCallItem(id=item.id, status="in_progress", call_id=piece.id, name=piece.name)
                self._open[piece.index] = (item, self.announce(item, shown))
            elif isinstance(piece, Arguments):
                item, index = self._open[piece.index]
                item.arguments += piece.text
                self.sender.event(FunctionCallArgumentsDelta(response_id=self.response_id, item_id=item.id,
                                                             output_index=index, call_id=item.call_id,
                                                             delta=piece.text))
        self._finish_parsed()

    def _finish_parsed(self) -> None:
        for call in self.parser.calls:
            if call.id in self._done:
                continue
            opened = self._opened(call)
            if opened is not None and opened[0].arguments == call.arguments:
                self._finish(*opened, call.arguments)

    def _opened(self, call: ParsedCall) -> tuple[Item, int] | None:
        return next((entry for entry in self._open.values() if entry[0].call_id == call.id), None)

    def _finish(self, item: Item, index: int, arguments: str) -> None:
        item.arguments = arguments
        item.status = "completed" if is_json(arguments) else "incomplete"
        self._open = {k: v for k, v in self._open.items() if v[0] is not item}
        self._done.add(item.call_id)
        self.sender.event(FunctionCallArgumentsDone(response_id=self.response_id, item_id=item.id, output_index=index,
                                                    call_id=item.call_id, name=item.name, arguments=arguments))
        shown = protocol_item(item)
        self.sender.event(OutputItemDone(response_id=self.response_id, output_index=index, item=shown))
        self.sender.event(ConversationItemDone(item=shown))


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
