"""The schema rewrites before a grammar is built: only schemas change, never the data inside
them, and an object's own word on extra keys stands."""

from kvpilot_server.api.json_schemas import closed, rebased, styled

# A property named like a keyword, data that looks like a schema, and every place a schema nests.
SCHEMA = {
    "type": "object",
    "properties": {
        "default": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "open": {"type": "object", "properties": {}, "additionalProperties": True},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Inner"}},
        "either": {"anyOf": [{"$ref": "#/definitions/Old"}, {"type": "null"}]},
        "me": {"$ref": "#"},
    },
    "const_like": {"const": {"type": "object", "properties": {"a": {}}}},
    "default": {"properties": {"kept": 1}},
    "$defs": {"Inner": {"type": "object", "properties": {"a": {"type": "string"}}}},
    "definitions": {"Old": {"properties": {"b": {"type": "string"}}}},
}


def test_closed_closes_every_object_that_names_its_keys_and_nothing_else():
    out = closed(SCHEMA)
    assert out["additionalProperties"] is False
    assert out["properties"]["default"]["additionalProperties"] is False
    assert out["properties"]["open"]["additionalProperties"] is True  # its own word stands
    assert out["$defs"]["Inner"]["additionalProperties"] is False
    assert out["definitions"]["Old"]["additionalProperties"] is False
    assert out["default"] == {"properties": {"kept": 1}}  # data, not a schema
    assert out["const_like"] == SCHEMA["const_like"]  # an unknown keyword's value: left alone
    assert "additionalProperties" not in out["properties"]["either"]["anyOf"][1]
    assert "additionalProperties" not in SCHEMA  # the request's own schema is untouched


def test_rebased_points_local_refs_at_where_the_schema_now_sits():
    out = rebased(SCHEMA, "/properties/arguments")
    assert out["properties"]["items"]["items"] == {"$ref": "#/properties/arguments/$defs/Inner"}
    either = out["properties"]["either"]["anyOf"][0]
    assert either == {"$ref": "#/properties/arguments/definitions/Old"}
    assert out["properties"]["me"] == {"$ref": "#/properties/arguments"}
    remote = rebased({"$ref": "https://example.com/s.json"}, "/p")
    assert remote == {"$ref": "https://example.com/s.json"}  # not ours to move (nor to fetch)


def test_styled_sets_the_root_options_over_the_schemas_own():
    schema = {"type": "object", "x-guidance": {"whitespace_flexible": False, "lenient": True}}
    out = styled(schema, {"whitespace_flexible": True})
    assert out["x-guidance"] == {"whitespace_flexible": True, "lenient": True}
    assert schema["x-guidance"]["whitespace_flexible"] is False
