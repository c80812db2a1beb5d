"""What the model sees of an MCP tool's result: :func:`result_text`."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = ["result_text"]


def result_text(result: Any) -> str:
    """What the model sees of a ``CallToolResult``, its parts in order, one per line:

    * text, and an embedded resource's text: as they are;
    * image and audio: ``[image: image/png, 2048 bytes]`` (the decoded size);
    * an embedded binary resource: ``[resource URI: MIME, N bytes]`` (``binary`` without a
      MIME type);
    * a resource link: ``[resource link: URI NAME]``;
    * a content type this function does not know (one a newer SDK may add):
      ``[TYPE content]``;
    * then the structured content as JSON, unless the text parts already say it (see
      :func:`_shown`).

    ``isError`` does not change the text: :meth:`rlfactory_mcp.client.MCPTool.call` marks the result a tool
    error."""
    parts: list[str] = []
    texts: list[str] = []
    for item in result.content or []:
        kind = getattr(item, "type", None)
        if kind == "text":
            parts.append(item.text)
            texts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {item.mime_type}, {_decoded_size(item.data)}]")
        elif kind == "resource_link":
            label = f" {item.name}" if getattr(item, "name", None) else ""
            parts.append(f"[resource link: {item.uri}{label}]")
        elif kind == "resource":
            resource = item.resource
            if getattr(resource, "text", None) is not None:
                parts.append(resource.text)
                texts.append(resource.text)
            else:
                mime = resource.mime_type or "binary"
                parts.append(f"[resource {resource.uri}: {mime}, {_decoded_size(getattr(resource, 'blob', ''))}]")
        else:
            parts.append(f"[{kind or type(item).__name__} content]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not _shown(texts, structured):
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _shown(texts: list[str], structured: Any) -> bool:
    """Whether the text parts already say what the structured content does: one of them is
    its JSON, or the value of a wrapped result (``{"result": 5}`` next to the text ``5``),
    or, for a wrapped list, the text parts are its items in order (what the SDK's
    ``MCPServer`` sends for a tool that returns a list)."""
    if any(_is_json_of(text, structured) for text in texts):
        return True
    if not (isinstance(structured, dict) and set(structured) == {"result"}):
        return False
    value = structured["result"]
    if any(_says(text, value) for text in texts):
        return True
    return (isinstance(value, list) and len(value) == len(texts) > 0
            and all(_says(text, item) for text, item in zip(texts, value)))


def _says(text: str, value: Any) -> bool:
    return text == value or (not isinstance(value, (dict, list)) and text == str(value)) or _is_json_of(text, value)


def _decoded_size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=False))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} base64 characters"


def _is_json_of(text: str, value: Any) -> bool:
    try:
        return json.loads(text) == value
    except (json.JSONDecodeError, TypeError):
        return False
