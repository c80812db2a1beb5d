"""What the model sees of a tool result: ``result_text`` on hand-built ``CallToolResult``
objects, one per content type of the MCP spec and each way structured content can come,
and how ``MCPTool.call`` turns ``isError`` results into tool errors. (The live servers of
test_mcp_tools.py send text, images, resource links, embedded text resources and
structured content over the wire.)"""

import base64
import json
from types import SimpleNamespace

import pydantic
import pytest

from mcp.types import (AudioContent, BlobResourceContents, CallToolResult, EmbeddedResource, ImageContent,
                       ResourceLink, TextContent, TextResourceContents)
from rlfactory_mcp import MCPTool, result_text


def b64(size: int) -> str:
    return base64.b64encode(bytes(range(256)) * (size // 256) + bytes(size % 256)).decode()


def text(value: str) -> TextContent:
    return TextContent(type="text", text=value)


def test_each_content_type_in_order_one_line_each():
    result = CallToolResult(content=[
        text("caption"),
        ImageContent(type="image", data=b64(100), mime_type="image/png"),
        AudioContent(type="audio", data=b64(300), mime_type="audio/wav"),
        ResourceLink(type="resource_link", uri="file:///tmp/a.txt", name="a.txt"),
        EmbeddedResource(type="resource", resource=TextResourceContents(uri="memo://n", text="note text")),
        EmbeddedResource(type="resource", resource=BlobResourceContents(uri="file:///r.pdf", mime_type="application/pdf",
                                                                        blob=b64(2048))),
        EmbeddedResource(type="resource", resource=BlobResourceContents(uri="memo://raw", blob=b64(5))),
    ])
    assert result_text(result).splitlines() == [
        "caption", "[image: image/png, 100 bytes]", "[audio: audio/wav, 300 bytes]",
        "[resource link: file:///tmp/a.txt a.txt]", "note text", "[resource file:///r.pdf: application/pdf, 2048 bytes]",
        "[resource memo://raw: binary, 5 bytes]"]


def test_data_that_is_not_base64_is_counted_in_characters():
    result = CallToolResult(content=[AudioContent(type="audio", data="abc", mime_type="audio/ogg")])
    assert result_text(result) == "[audio: audio/ogg, 3 base64 characters]"


def test_structured_content_without_a_text_part_is_its_json():
    assert result_text(CallToolResult(content=[], structured_content={"temp": 21.5, "city": "Zürich"})) == (
        '{"temp": 21.5, "city": "Zürich"}')
    image = ImageContent(type="image", data=b64(10), mime_type="image/png")
    assert result_text(CallToolResult(content=[image], structured_content={"w": 2})) == (
        '[image: image/png, 10 bytes]\n{"w": 2}')


def test_structured_content_that_differs_from_the_text_is_shown_after_it():
    result = CallToolResult(content=[text("3 results")], structured_content={"count": 3, "ids": [1, 2, 3]})
    assert result_text(result) == '3 results\n{"count": 3, "ids": [1, 2, 3]}'


@pytest.mark.parametrize("parts, structured, expected", [
    # the spec's recommendation: the same JSON as a text part (any spacing)
    (['{\n  "a": 1,\n  "b": [true, null]\n}'], {"a": 1, "b": [True, None]}, '{\n  "a": 1,\n  "b": [true, null]\n}'),
    # a wrapped result next to its value, as the SDK's MCPServer sends for a returned str, int, bool
    (["hi"], {"result": "hi"}, "hi"),
    (["5"], {"result": 5}, "5"),
    (["true"], {"result": True}, "true"),
    # a returned list: one text part per item, next to the wrapped list
    (["a", "b"], {"result": ["a", "b"]}, "a\nb"),
    (['{"x": 1}', '{"x": 2}'], {"result": [{"x": 1}, {"x": 2}]}, '{"x": 1}\n{"x": 2}'),
    # ... but parts that are not exactly the items do not hide it
    (["a"], {"result": ["a", "b"]}, 'a\n{"result": ["a", "b"]}'),
    (["b", "a"], {"result": ["a", "b"]}, 'b\na\n{"result": ["a", "b"]}'),
    ([], {"result": []}, '{"result": []}'),
])
def test_structured_content_already_said_by_the_text_is_not_repeated(parts, structured, expected):
    assert result_text(CallToolResult(content=[text(p) for p in parts], structured_content=structured)) == expected


async def test_what_the_sdks_own_server_sends_for_returned_values_is_shown_once():
    """The same rules on the results the SDK's MCPServer builds (in process, no transport)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("values")

    @server.tool()
    def letters() -> list[str]:
        """Letters."""
        return ["a", "b"]

    @server.tool()
    def rows() -> list[dict]:
        """Rows."""
        return [{"x": 1}, {"x": 2}]

    @server.tool()
    def count() -> int:
        """A number."""
        return 7

    @server.tool()
    def facts() -> dict:
        """An object."""
        return {"name": "Peru", "capital": "Lima"}

    shown = {name: result_text(await server.call_tool(name, {})) for name in ("letters", "rows", "count", "facts")}
    assert shown["letters"] == "a\nb" and shown["count"] == "7"
    assert shown["rows"] == '{\n  "x": 1\n}\n{\n  "x": 2\n}'
    assert json.loads(shown["facts"]) == {"name": "Peru", "capital": "Lima"}


def test_a_content_type_the_sdk_does_not_know_fails_in_the_sdk_and_one_it_adds_later_is_named():
    # The SDK validates every result against the spec's content types: a server sending an
    # unknown type makes the call raise (the tool manager's `exception` error), it never
    # reaches result_text ...
    with pytest.raises(pydantic.ValidationError):
        CallToolResult.model_validate({"content": [{"type": "video", "data": b64(10), "mimeType": "video/mp4"}]})
    # ... which names a type that a newer SDK accepts and this code does not know yet.
    future = CallToolResult.model_construct(content=[text("clip"), SimpleNamespace(type="video", data="AAAA")],
                                            structured_content=None, is_error=False)
    assert result_text(future) == "clip\n[video content]"


class FakePool:
    """A server pool that answers every call with a fixed result."""

    def __init__(self, result):
        self.result = result

    async def call(self, tool, arguments):
        return self.result


def tool(result) -> MCPTool:
    return MCPTool("lookup", "lookup", "srv", "Look something up.", {"type": "object"}, FakePool(result))


@pytest.mark.parametrize("result, content", [
    (CallToolResult(content=[text("no such city: Atlantis")], is_error=True), "no such city: Atlantis"),
    (CallToolResult(content=[], structured_content={"error": "quota"}, is_error=True), '{"error": "quota"}'),
    (CallToolResult(content=[], is_error=True), "lookup failed"),
])
async def test_is_error_results_are_tool_errors_the_model_sees(result, content):
    answer = await tool(result).call({})
    assert (answer.error, answer.content) == ("tool_error", content)


async def test_a_result_without_is_error_is_a_success_even_when_empty():
    answer = await tool(CallToolResult(content=[])).call({})
    assert (answer.error, answer.content) == (None, "")
    answer = await tool(CallToolResult(content=[text("Lima")], structured_content={"result": "Lima"})).call({})
    assert (answer.error, answer.content) == (None, "Lima")
