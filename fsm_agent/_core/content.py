"""Tool results that hold images or files: the tool message that carries them.

A tool may return :class:`Image` and :class:`File` values anywhere in its result (alone, in
a list, in a dict). The model should see them as pictures and documents, not as base64
inside JSON, so the tool message is built in two parts:

* the JSON text of the result, where each image or file is replaced by a small
  placeholder ``{"type": "image", "media_type": "image/png", "bytes": 1234, "part": 1}``
  (``part`` is its index in the content list below). This text is what the trace records
  and what a text-only provider sees; ``max_output_bytes`` counts it plus the raw bytes
  of the media. Media past ``Budget.max_media_bytes`` in one result are left out: their
  placeholder has no ``part`` and says ``"omitted"`` why;
* when there is media, ``content`` becomes a list of Chat Completions content parts: the
  text first, then one ``image_url`` part (a ``data:`` URL) per image and one ``file``
  part (``file_data`` as a ``data:`` URL, plus ``filename``) per file, in order.

Each provider adapter turns those parts into its own: Anthropic ``image``/``document``
blocks inside ``tool_result``, Responses ``input_image``/``input_file`` items inside
``function_call_output``; Chat Completions, whose tool messages carry text only, gets the
text with its placeholders (see ``OpenAIChatModel(tool_media=...)``).

Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsm_agent._errors import ConfigError

__all__ = [
    "IMAGE_TYPES",
    "MAX_DEPTH",
    "File",
    "Image",
    "Media",
    "media_parts",
    "part_media",
    "split_data_url",
    "split_media",
    "tool_message",
]

#: The image types every supported provider accepts inside a tool result.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")
_DATA_URL = re.compile(r"^data:([^;,]+);base64,(.*)$", re.S)
#: Walk no deeper than this for media: deeper values are left as they are (the JSON
#: encoding of the result has its own policy for deep nesting). ``check`` walks a
#: recorded result as deep for the placeholders it replays (``trace/replay.py``).
MAX_DEPTH = 64


@dataclass(frozen=True, eq=True)
class Image:
    """An image a tool returns: raw bytes and their media type (one of
    :data:`IMAGE_TYPES`)."""

    data: bytes
    media_type: str = "image/png"

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray)):
            raise ConfigError(f"Image.data must be bytes, got {type(self.data).__name__}")
        if self.media_type not in IMAGE_TYPES:
            raise ConfigError(
                f"Image.media_type must be one of {', '.join(IMAGE_TYPES)}, "
                f"got {self.media_type!r} (return other kinds as File)"
            )


@dataclass(frozen=True, eq=True)
class File:
    """A file a tool returns (a PDF, a text file, audio, ...): bytes, media type, name."""

    data: bytes
    media_type: str
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray)):
            raise ConfigError(f"File.data must be bytes, got {type(self.data).__name__}")
        if not isinstance(self.media_type, str) or not _MEDIA_TYPE.match(self.media_type):
            raise ConfigError(
                f"File.media_type must be a media type such as 'application/pdf', "
                f"got {self.media_type!r}"
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ConfigError("File.name must be a non-empty string or None")


Media = Image | File


def _placeholder(item: Media, part: int | None, limit: int | None) -> dict[str, Any]:
    kind = "image" if isinstance(item, Image) else "file"
    out: dict[str, Any] = {"type": kind, "media_type": item.media_type, "bytes": len(item.data)}
    if isinstance(item, File) and item.name:
        out["name"] = item.name
    if part is None:
        out["omitted"] = f"the result's media would exceed max_media_bytes ({limit})"
    else:
        out["part"] = part
    return out


def split_media(value: Any, max_bytes: int | None = None) -> tuple[Any, list[Media]]:
    """``value`` with every :class:`Image`/:class:`File` replaced by its placeholder, and
    the media in the order their placeholders number them (parts 1, 2, ...).

    With ``max_bytes``, media are kept in order while their bytes add up to at most that;
    the placeholders of the others say they were omitted, and they are not returned.
    Values without media come back as the very same object, so the common case costs one
    walk and no copy.
    """
    media: list[Media] = []
    seen: set[int] = set()
    kept = 0

    def walk(v: Any, depth: int) -> Any:
        nonlocal kept
        if isinstance(v, (Image, File)):
            if max_bytes is not None and kept + len(v.data) > max_bytes:
                return _placeholder(v, None, max_bytes)
            kept += len(v.data)
            media.append(v)
            return _placeholder(v, len(media), max_bytes)
        if depth >= MAX_DEPTH or id(v) in seen:
            return v
        if isinstance(v, Mapping):
            seen.add(id(v))
            pairs = [(k, walk(x, depth + 1)) for k, x in v.items()]
            seen.discard(id(v))
            changed = any(new is not old for (_, new), old in zip(pairs, v.values(), strict=True))
            return dict(pairs) if changed else v
        if isinstance(v, (list, tuple)):
            seen.add(id(v))
            items = [walk(x, depth + 1) for x in v]
            seen.discard(id(v))
            return items if any(a is not b for a, b in zip(items, v, strict=True)) else v
        return v

    try:
        return walk(value, 0), media
    except Exception:  # a value whose walk fails (a Mapping that raises, ...): as it is;
        return value, []  # the JSON encoding of the result has its own policy for it


def _data_url(item: Media) -> str:
    return f"data:{item.media_type};base64,{base64.b64encode(item.data).decode('ascii')}"


def media_parts(media: Sequence[Media]) -> list[dict[str, Any]]:
    """The Chat Completions content parts of ``media``, in order."""
    parts: list[dict[str, Any]] = []
    for item in media:
        if isinstance(item, Image):
            parts.append({"type": "image_url", "image_url": {"url": _data_url(item)}})
        else:
            file: dict[str, Any] = {"file_data": _data_url(item)}
            if item.name:
                file["filename"] = item.name
            parts.append({"type": "file", "file": file})
    return parts


def tool_message(call_id: str, text: str, media: Sequence[Media]) -> dict[str, Any]:
    """The tool message answering ``call_id``: plain text, or text plus media parts."""
    if not media:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    content = [{"type": "text", "text": text}, *media_parts(media)]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def part_media(part: Any) -> Media | None:
    """The :class:`Image` or :class:`File` a content part made by :func:`media_parts`
    carries, or ``None`` for anything else (text parts, URLs that are not ``data:``)."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, Mapping) else None
        decoded = _decode(url)
        if decoded is None or decoded[0] not in IMAGE_TYPES:
            return None
        return Image(decoded[1], decoded[0])
    if kind == "file":
        inner = part.get("file")
        if not isinstance(inner, Mapping):
            return None
        decoded = _decode(inner.get("file_data"))
        if decoded is None or not _MEDIA_TYPE.match(decoded[0]):
            return None
        name = inner.get("filename")
        return File(decoded[1], decoded[0], name if isinstance(name, str) and name else None)
    return None


def split_data_url(url: Any) -> tuple[str, str] | None:
    """``(media_type, base64 text)`` of a ``data:...;base64,`` URL, else ``None``
    (adapters pass the base64 on without decoding it)."""
    if not isinstance(url, str):
        return None
    match = _DATA_URL.match(url)
    return None if match is None else (match.group(1), match.group(2))


def _decode(url: Any) -> tuple[str, bytes] | None:
    parts = split_data_url(url)
    if parts is None:
        return None
    try:
        return parts[0], base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None
