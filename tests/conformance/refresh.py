#!/usr/bin/env python3
"""Regenerates the request-body JSON Schemas in this folder from each provider's own description.

Usage (each option regenerates one file; give any subset):

    python3 refresh.py --openai PATH/openapi.json [--openai-ref REPO@COMMIT]
    python3 refresh.py --anthropic            # needs the packages `anthropic` and `pydantic` importable
    python3 refresh.py --gemini-protos DIR [--gemini-ref REPO@COMMIT]
    python3 refresh.py --gemini-discovery PATH/generativelanguage-api.json [--gemini-ref ...]

`--openai` reads OpenAI's OpenAPI document (JSON form) and writes openai.chat.schema.json.
`--anthropic` reads the installed Anthropic Python SDK's `MessageCreateParamsNonStreaming` through
pydantic and writes anthropic.messages.schema.json.
`--gemini-protos` reads a checkout (or extract) of the googleapis/googleapis tree, root folder DIR,
and writes gemini.generate_content.schema.json from google/ai/generativelanguage/v1beta/*.proto;
`--gemini-discovery` writes the same file from a discovery document instead (see README.md).
`--out DIR` writes elsewhere than beside this script. `--*-ref` text is recorded in the file's
`$comment`. Python 3.11 standard library only, except `--anthropic`. The output is deterministic:
keys sorted, 2-space indent, a trailing newline.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

DRAFT = "https://json-schema.org/draft/2020-12/schema"
HERE = Path(__file__).resolve().parent

# Keywords whose value is a map of name -> schema, a schema, or a list of schemas.
MAP_OF_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
ONE_SCHEMA = (
    "items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems", "not",
    "contains", "propertyNames", "if", "then", "else", "additionalItems",
)
LIST_OF_SCHEMAS = ("anyOf", "allOf", "oneOf", "prefixItems")
# The JSON Schema (2020-12) keywords kept from an OpenAPI schema object; every other key is dropped.
JSON_SCHEMA_KEYWORDS = {
    "$ref", "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "anyOf", "allOf", "oneOf", "not", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties", "propertyNames",
    "patternProperties", "format", "title", "description", "default", "deprecated", "readOnly",
    "writeOnly", "contentEncoding", "contentMediaType",
}


def write(path: Path, schema: dict) -> None:
    text = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(text.encode())} bytes, {len(schema.get('$defs', {}))} defs)")


def map_subschemas(node, fn):
    """Applies `fn` to every direct subschema of the schema `node`, in place."""
    if not isinstance(node, dict):
        return
    for key in MAP_OF_SCHEMAS:
        if isinstance(node.get(key), dict):
            node[key] = {name: fn(sub) for name, sub in node[key].items()}
    for key in ONE_SCHEMA:
        if isinstance(node.get(key), dict):
            node[key] = fn(node[key])
    for key in LIST_OF_SCHEMAS:
        if isinstance(node.get(key), list):
            node[key] = [fn(sub) for sub in node[key]]


def walk(node, fn):
    """Applies `fn` bottom-up to `node` and every schema below it; returns the result."""
    map_subschemas(node, lambda sub: walk(sub, fn))
    return fn(node)


def refs_in(node, out: set[str]) -> set[str]:
    def visit(n):
        if isinstance(n, dict) and isinstance(n.get("$ref"), str):
            out.add(n["$ref"])
        return n
    walk(copy.deepcopy(node), visit)
    return out


def dedupe_any_of(node):
    """An `anyOf` with repeated branches keeps one of each; a single branch is merged into `node`."""
    if isinstance(node, dict) and isinstance(node.get("anyOf"), list):
        seen, branches = set(), []
        for branch in node["anyOf"]:
            key = json.dumps(branch, sort_keys=True)
            if key not in seen:
                seen.add(key)
                branches.append(branch)
        node["anyOf"] = branches
        if len(branches) == 1 and isinstance(branches[0], dict) and not set(branches[0]) & set(node):
            del node["anyOf"]
            node.update(branches[0])
    return node


# --------------------------------------------------------------------------------------------
# OpenAI: OpenAPI 3.x schema objects -> JSON Schema 2020-12

OPENAI_ROOT = "CreateChatCompletionRequest"


def openai_node(node):
    if not isinstance(node, dict):
        return node
    nullable = node.get("nullable") is True
    out = {k: v for k, v in node.items() if k in JSON_SCHEMA_KEYWORDS}
    ref = out.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith("#/components/schemas/"):
            raise SystemExit(f"openai: unexpected $ref {ref}")
        out["$ref"] = "#/$defs/" + ref.rsplit("/", 1)[1]
    # OpenAPI 3.0 booleans for exclusive bounds -> 2020-12 numbers.
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(flag), bool):
            if out.pop(flag) and bound in out:
                out[flag] = out.pop(bound)
    if nullable:
        if any(k in out for k in ("$ref", "allOf", "anyOf", "oneOf")):
            annotations = {k: out.pop(k) for k in ("description", "title", "default", "deprecated") if k in out}
            out = {"anyOf": [out, {"type": "null"}], **annotations}
        else:
            if "type" in out:
                types = out["type"] if isinstance(out["type"], list) else [out["type"]]
                out["type"] = types + (["null"] if "null" not in types else [])
            if "enum" in out and None not in out["enum"]:
                out["enum"] = out["enum"] + [None]
    return out


def reachable(defs: dict, root: str) -> dict:
    reached, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(r.rsplit("/", 1)[1] for r in refs_in(defs[name], set()))
    return {name: defs[name] for name in sorted(reached)}


def flatten_all_of(node: dict, defs: dict) -> dict:
    """An `allOf` of object schemas (inline or `$ref`s to defs) as one object schema."""
    if set(node) - {"allOf", "description", "title"}:
        raise SystemExit(f"openai: cannot flatten {sorted(node)}")
    out = {"type": "object", "properties": {}}
    for key in ("description", "title"):
        if key in node:
            out[key] = node[key]
    for branch in node["allOf"]:
        if set(branch) == {"$ref"}:
            branch = defs[branch["$ref"].rsplit("/", 1)[1]]
        if "allOf" in branch:
            branch = flatten_all_of(branch, defs)
        if set(branch) - {"type", "properties", "required", "description", "title"} or branch.get("type", "object") != "object":
            raise SystemExit(f"openai: cannot flatten a branch with {sorted(branch)}")
        for name, schema in branch.get("properties", {}).items():
            before = out["properties"].get(name)
            if before is None or before == schema:
                out["properties"][name] = schema
            else:  # declared by more than one branch: all apply
                earlier = before["allOf"] if set(before) == {"allOf"} else [before]
                out["properties"][name] = {"allOf": earlier + [schema]}
        for name in branch.get("required", []):
            out.setdefault("required", [])
            if name not in out["required"]:
                out["required"].append(name)
    return out


def openai(path: Path, ref: str | None, out_dir: Path) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    schemas = document["components"]["schemas"]
    body = document["paths"]["/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    if body.get("$ref") != f"#/components/schemas/{OPENAI_ROOT}":
        raise SystemExit(f"openai: the request body is no longer {OPENAI_ROOT}: {body}")
    defs, todo = {}, [OPENAI_ROOT]
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        defs[name] = walk(copy.deepcopy(schemas[name]), openai_node)
        todo.extend(r.rsplit("/", 1)[1] for r in refs_in(defs[name], set()))
    # The API refuses unknown top-level arguments ("Unrecognized request argument supplied"): the root,
    # an allOf of object schemas, is flattened into one object and closed.
    defs[OPENAI_ROOT] = flatten_all_of(defs[OPENAI_ROOT], defs)
    defs[OPENAI_ROOT]["additionalProperties"] = False
    defs = reachable(defs, OPENAI_ROOT)
    source = ref or path.name
    schema = {
        "$schema": DRAFT,
        "$comment": f"Body of POST /chat/completions ({OPENAI_ROOT}), generated by refresh.py from "
        f"OpenAI's OpenAPI document {source} (info.version {document['info'].get('version')}). Do not edit.",
        "$ref": f"#/$defs/{OPENAI_ROOT}",
        "$defs": defs,
    }
    write(out_dir / "openai.chat.schema.json", schema)


# --------------------------------------------------------------------------------------------
# Anthropic: the SDK's TypedDict -> pydantic JSON Schema, closed

ANTHROPIC_ROOT = "MessageCreateParamsNonStreaming"


def anthropic_node(node):
    if not isinstance(node, dict):
        return node
    node.pop("title", None)
    # `format: path` is the SDK's own file-path input (read and base64-encoded before sending).
    if node.get("format") == "path":
        del node["format"]
    # Objects with declared fields are closed: SDK TypedDicts list every key the API takes, and the
    # SDK's response models (accepted back as params) are open only to parse future responses.
    if "properties" in node:
        node["additionalProperties"] = False
    return dedupe_any_of(node)


def anthropic_schema(out_dir: Path) -> None:
    import anthropic  # noqa: PLC0415
    import pydantic  # noqa: PLC0415
    from anthropic.types import message_create_params  # noqa: PLC0415

    root_type = getattr(message_create_params, ANTHROPIC_ROOT)
    generated = pydantic.TypeAdapter(root_type).json_schema(ref_template="#/$defs/{model}")
    defs = generated.pop("$defs", {})
    defs[ANTHROPIC_ROOT] = generated
    defs = {name: walk(sub, anthropic_node) for name, sub in defs.items()}
    missing = {"model", "messages", "max_tokens"} - set(defs[ANTHROPIC_ROOT].get("required", []))
    if missing:
        raise SystemExit(f"anthropic: the SDK no longer requires {sorted(missing)}")
    schema = {
        "$schema": DRAFT,
        "$comment": f"Body of POST /v1/messages, non-streaming ({ANTHROPIC_ROOT}), generated by refresh.py "
        f"from the Anthropic Python SDK anthropic {anthropic.__version__} "
        f"(anthropic.types.message_create_params) with pydantic {pydantic.VERSION}. Do not edit.",
        "$ref": f"#/$defs/{ANTHROPIC_ROOT}",
        "$defs": reachable(defs, ANTHROPIC_ROOT),
    }
    write(out_dir / "anthropic.messages.schema.json", schema)


# --------------------------------------------------------------------------------------------
# Gemini: shared JSON forms of proto3 scalars (the proto3 JSON mapping, as the API parses it)

GEMINI_ROOT = "GenerateContentRequest"
INT64 = {"type": ["integer", "string"], "pattern": "^-?[0-9]+$"}
UINT64 = {"type": ["integer", "string"], "minimum": 0, "pattern": "^[0-9]+$"}
BYTES = {"type": "string", "contentEncoding": "base64", "pattern": "^[A-Za-z0-9+/_-]*={0,2}$"}
SCALARS = {
    "string": {"type": "string"},
    "bool": {"type": "boolean"},
    "double": {"type": "number", "format": "double"},
    "float": {"type": "number", "format": "float"},
    "int32": {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1},
    "sint32": {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1},
    "sfixed32": {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1},
    "uint32": {"type": "integer", "format": "uint32", "minimum": 0, "maximum": 2**32 - 1},
    "fixed32": {"type": "integer", "format": "uint32", "minimum": 0, "maximum": 2**32 - 1},
    "int64": {**INT64, "format": "int64"},
    "sint64": {**INT64, "format": "int64"},
    "sfixed64": {**INT64, "format": "int64"},
    "uint64": {**UINT64, "format": "uint64"},
    "fixed64": {**UINT64, "format": "uint64"},
    "bytes": {**BYTES, "format": "byte"},
}
WELL_KNOWN = {
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Duration": {"type": "string", "format": "google-duration", "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$"},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.FieldMask": {"type": "string", "format": "google-fieldmask"},
    "google.protobuf.Empty": {"type": "object", "additionalProperties": False},
    "google.protobuf.Any": {"type": "object", "required": ["@type"]},
    "google.protobuf.DoubleValue": SCALARS["double"],
    "google.protobuf.FloatValue": SCALARS["float"],
    "google.protobuf.Int64Value": SCALARS["int64"],
    "google.protobuf.UInt64Value": SCALARS["uint64"],
    "google.protobuf.Int32Value": SCALARS["int32"],
    "google.protobuf.UInt32Value": SCALARS["uint32"],
    "google.protobuf.BoolValue": SCALARS["bool"],
    "google.protobuf.StringValue": SCALARS["string"],
    "google.protobuf.BytesValue": SCALARS["bytes"],
}


def at_most_one_of(groups: list[list[str]]) -> list[dict]:
    """Constraints that no two members of each group are present (a proto oneof)."""
    out = []
    for names in groups:
        pairs = [[a, b] for i, a in enumerate(names) for b in names[i + 1:]]
        if pairs:
            out.append({"not": {"anyOf": [{"required": p} for p in pairs]}})
    return out


def gemini_document(defs: dict, source: str, kind: str) -> dict:
    return {
        "$schema": DRAFT,
        "$comment": f"Body of POST /v1beta/models/{{model}}:generateContent ({GEMINI_ROOT}), generated by "
        f"refresh.py from {kind} {source}. Do not edit.",
        "$ref": f"#/$defs/{GEMINI_ROOT}",
        "$defs": dict(sorted(defs.items())),
    }


# --------------------------------------------------------------------------------------------
# Gemini from the .proto files (google/ai/generativelanguage/v1beta in googleapis/googleapis)

TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<line>//[^\n]*)|(?P<block>/\*.*?\*/)|(?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')"""
    r"""|(?P<num>-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|inf|nan))(?![\w.])"""
    r"""|(?P<id>\.?[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)|(?P<sym>[{}\[\]()<>;=,:.\-+])""",
    re.S,
)


def tokenize(text: str):
    """(kind, value, leading comment) tuples; a comment counts as leading when no blank line follows it."""
    tokens, pending, pos, fresh_line = [], [], 0, True
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise SystemExit(f"proto: cannot read {text[pos:pos + 40]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            if "\n" in m.group():
                fresh_line = True
            if m.group().count("\n") > 1:
                pending = []
        elif kind in ("line", "block") and not fresh_line:
            pass  # a trailing comment, on the line of the token before it
        elif kind == "line":
            pending.append(m.group()[2:])
        elif kind == "block":
            pending.extend(line.strip().lstrip("*") for line in m.group()[2:-2].splitlines())
        else:
            tokens.append((kind, m.group(), pending))
            pending, fresh_line = [], False
    return tokens


def comment_text(lines: list[str]) -> str:
    return " ".join(line.strip() for line in lines if line.strip())


def json_name(name: str) -> str:
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


class ProtoParser:
    def __init__(self, tokens, package_hint=""):
        self.t, self.i = tokens, 0
        self.package = package_hint
        self.imports: list[str] = []
        self.messages: dict[str, dict] = {}
        self.enums: dict[str, dict] = {}
        self.services: dict[str, dict] = {}

    def peek(self, k=0):
        return self.t[self.i + k][1] if self.i + k < len(self.t) else None

    def take(self, expect=None):
        kind, value, comment = self.t[self.i]
        if expect is not None and value != expect:
            raise SystemExit(f"proto: expected {expect!r}, found {value!r} near token {self.i}")
        self.i += 1
        return value, comment

    def skip_balanced(self, open_, close):
        depth = 0
        while True:
            value, _ = self.take()
            if value == open_:
                depth += 1
            elif value == close:
                depth -= 1
                if depth == 0:
                    return

    def skip_statement(self):
        """Skips to the end of a `;` statement, over any aggregate `{...}` value inside."""
        while True:
            if self.peek() == "{":
                self.skip_balanced("{", "}")
                continue
            value, _ = self.take()
            if value == ";":
                return

    def parse_file(self):
        while self.i < len(self.t):
            word = self.peek()
            if word in ("syntax", "edition", "option"):
                self.skip_statement()
            elif word == "package":
                self.take()
                self.package, _ = self.take()
                self.take(";")
            elif word == "import":
                self.take()
                if self.peek() in ("public", "weak"):
                    self.take()
                path, _ = self.take()
                self.imports.append(path[1:-1])
                self.take(";")
            elif word == "message":
                self.parse_message(self.package)
            elif word == "enum":
                self.parse_enum(self.package)
            elif word == "service":
                self.parse_service()
            elif word == "extend":
                self.take()
                self.take()
                self.skip_balanced("{", "}")
            elif word == ";":
                self.take()
            else:
                raise SystemExit(f"proto: unexpected {word!r} at file level")

    def parse_options(self):
        """A field's `[...]` options: field_behavior values, json_name, deprecated."""
        options = {"field_behavior": []}
        self.take("[")
        while True:
            name_parts = []
            while self.peek() != "=":
                value, _ = self.take()
                name_parts.append(value)
            name = "".join(name_parts)
            self.take("=")
            if self.peek() == "{":
                self.skip_balanced("{", "}")
                value = None
            else:
                value, _ = self.take()
            if name == "(google.api.field_behavior)":
                options["field_behavior"].append(value)
            elif name == "json_name":
                options["json_name"] = value[1:-1]
            elif name == "deprecated":
                options["deprecated"] = value == "true"
            sep, _ = self.take()
            if sep == "]":
                return options
            if sep != ",":
                raise SystemExit(f"proto: bad option list near {sep!r}")

    def parse_field(self, comment, oneof=None):
        label = None
        if self.peek() in ("optional", "repeated", "required"):
            label, _ = self.take()
        if self.peek() == "map":
            self.take()
            self.take("<")
            key, _ = self.take()
            self.take(",")
            value, _ = self.take()
            self.take(">")
            ftype = ("map", key, value)
        else:
            ftype, _ = self.take()
        name, _ = self.take()
        self.take("=")
        self.take()  # number
        options = self.parse_options() if self.peek() == "[" else {"field_behavior": []}
        self.take(";")
        return {
            "name": name, "type": ftype, "repeated": label == "repeated", "oneof": oneof,
            "comment": comment_text(comment), **options,
        }

    def parse_message(self, scope):
        _, comment = self.take("message")
        name, _ = self.take()
        full = f"{scope}.{name}" if scope else name
        message = {"name": name, "full": full, "comment": comment_text(comment), "fields": [], "oneofs": []}
        self.messages[full] = message
        self.take("{")
        while self.peek() != "}":
            word = self.peek()
            if word == "message":
                self.parse_message(full)
            elif word == "enum":
                self.parse_enum(full)
            elif word == "oneof":
                self.take()
                group, _ = self.take()
                self.take("{")
                members = []
                while self.peek() != "}":
                    if self.peek() == "option":
                        self.skip_statement()
                        continue
                    _, _, field_comment = self.t[self.i]
                    field = self.parse_field(field_comment, oneof=group)
                    message["fields"].append(field)
                    members.append(field)
                self.take("}")
                message["oneofs"].append([f["name"] for f in members])
            elif word in ("option", "reserved", "extensions"):
                self.skip_statement()
            elif word == "extend":
                self.take()
                self.take()
                self.skip_balanced("{", "}")
            elif word == ";":
                self.take()
            else:
                _, _, field_comment = self.t[self.i]
                message["fields"].append(self.parse_field(field_comment))
        self.take("}")

    def parse_enum(self, scope):
        _, comment = self.take("enum")
        name, _ = self.take()
        full = f"{scope}.{name}" if scope else name
        values = []
        self.take("{")
        while self.peek() != "}":
            if self.peek() in ("option", "reserved"):
                self.skip_statement()
                continue
            if self.peek() == ";":
                self.take()
                continue
            value, _ = self.take()
            self.take("=")
            self.take()
            if self.peek() == "[":
                self.skip_balanced("[", "]")
            self.take(";")
            values.append(value)
        self.take("}")
        self.enums[full] = {"name": name, "full": full, "comment": comment_text(comment), "values": values}

    def parse_service(self):
        self.take("service")
        name, _ = self.take()
        start = self.i
        self.skip_balanced("{", "}")
        self.services[name] = {"tokens": self.t[start:self.i]}


def load_protos(root: Path, entry: str):
    parsers, todo, done = [], [entry], set()
    while todo:
        rel = todo.pop()
        if rel in done or rel.startswith(("google/protobuf/", "google/api/")):
            continue
        done.add(rel)
        parser = ProtoParser(tokenize((root / rel).read_text(encoding="utf-8")))
        parser.parse_file()
        parsers.append(parser)
        todo.extend(parser.imports)
    messages, enums, services = {}, {}, {}
    for p in parsers:
        messages.update(p.messages)
        enums.update(p.enums)
        services.update(p.services)
    return messages, enums, services


def resolve(name: str, scope: str, known) -> str:
    if name.startswith("."):
        return name[1:]
    parts = scope.split(".")
    for n in range(len(parts), -1, -1):
        candidate = ".".join(parts[:n] + [name])
        if candidate in known:
            return candidate
    raise SystemExit(f"proto: cannot resolve {name} from {scope}")


def path_fields(services: dict, rpc: str) -> set[str]:
    """Fields of the request bound in the URL path of `rpc`'s HTTP rule (and so not in the body)."""
    for service in services.values():
        values = [v for _, v, _ in service["tokens"]]
        for i, v in enumerate(values):
            if v == "rpc" and values[i + 1] == rpc:
                j = i + 2
                while values[j] != "rpc" and j < len(values) - 1:
                    if values[j] in ("post", "get", "put", "patch", "delete") and values[j + 1] == ":":
                        return set(re.findall(r"\{([\w.]+)", values[j + 2]))
                    j += 1
    raise SystemExit(f"proto: no HTTP rule for rpc {rpc}")


def gemini_from_protos(root: Path, ref: str | None, out_dir: Path) -> None:
    package = "google.ai.generativelanguage.v1beta"
    messages, enums, services = load_protos(root, "google/ai/generativelanguage/v1beta/generative_service.proto")
    known = set(messages) | set(enums) | set(WELL_KNOWN)
    in_path = path_fields(services, "GenerateContent")

    # Short names, as the discovery document uses; a clash falls back to the path below the package.
    def_names: dict[str, str] = {}
    reached, todo = [], [f"{package}.{GEMINI_ROOT}"]
    while todo:
        full = todo.pop(0)
        if full in reached:
            continue
        reached.append(full)
        msg = messages[full]
        for field in msg["fields"]:
            ftype = field["type"][2] if isinstance(field["type"], tuple) else field["type"]
            if ftype in SCALARS:
                continue
            target = resolve(ftype, msg["full"], known)
            if target in messages:
                todo.append(target)
    short = {}
    for full in reached:
        short.setdefault(messages[full]["name"], []).append(full)
    for name, fulls in short.items():
        for full in fulls:
            def_names[full] = name if len(fulls) == 1 else full.split(".", 4)[-1].replace(".", "")

    def field_schema(ftype: str, scope: str) -> dict:
        if ftype in SCALARS:
            return dict(SCALARS[ftype])
        target = resolve(ftype, scope, known)
        if target in WELL_KNOWN:
            return copy.deepcopy(WELL_KNOWN[target])
        if target in enums:
            enum = enums[target]
            out = {"type": "string", "enum": list(enum["values"])}
            return out
        return {"$ref": f"#/$defs/{def_names[target]}"}

    defs = {}
    for full in reached:
        msg = messages[full]
        properties, required = {}, []
        for field in msg["fields"]:
            ftype = field["type"]
            if isinstance(ftype, tuple):
                schema = {"type": "object", "additionalProperties": field_schema(ftype[2], msg["full"])}
            elif field["repeated"]:
                schema = {"type": "array", "items": field_schema(ftype, msg["full"])}
            else:
                schema = field_schema(ftype, msg["full"])
            if field["comment"]:
                schema["description"] = field["comment"]
            if "OUTPUT_ONLY" in field["field_behavior"]:
                schema["readOnly"] = True
            if field.get("deprecated"):
                schema["deprecated"] = True
            name = field.get("json_name") or json_name(field["name"])
            properties[name] = schema
            bound = full.endswith(f".{GEMINI_ROOT}") and field["name"] in in_path
            if "REQUIRED" in field["field_behavior"] and not bound:
                required.append(name)
        out = {"type": "object", "properties": properties, "additionalProperties": False}
        if msg["comment"]:
            out["description"] = msg["comment"]
        if required:
            out["required"] = required
        groups = [[json_name(n) for n in group] for group in msg["oneofs"]]
        constraints = at_most_one_of(groups)
        if constraints:
            out["allOf"] = constraints
        defs[def_names[full]] = out
    write(out_dir / "gemini.generate_content.schema.json",
          gemini_document(defs, ref or str(root), "the proto definitions (proto3 JSON mapping)"))


# --------------------------------------------------------------------------------------------
# Gemini from a discovery document (generativelanguage v1beta)

DISCOVERY_FORMATS = {
    "int64": SCALARS["int64"], "uint64": SCALARS["uint64"], "byte": SCALARS["bytes"],
    "google-duration": WELL_KNOWN["google.protobuf.Duration"],
    "google-datetime": WELL_KNOWN["google.protobuf.Timestamp"],
    "google-fieldmask": WELL_KNOWN["google.protobuf.FieldMask"],
}


def discovery_node(node: dict) -> dict:
    if "$ref" in node:
        out = {"$ref": f"#/$defs/{node['$ref']}"}
    elif node.get("type") == "any":
        out = {}
    elif node.get("format") in DISCOVERY_FORMATS and node.get("type") == "string":
        out = copy.deepcopy(DISCOVERY_FORMATS[node["format"]])
    else:
        out = {k: node[k] for k in ("type", "format", "enum") if k in node}
        if node.get("type") == "integer" and node.get("format") in ("int32", "uint32"):
            out = copy.deepcopy(SCALARS[node["format"]])
    if "items" in node:
        out["items"] = discovery_node(node["items"])
    if "additionalProperties" in node:
        out["additionalProperties"] = discovery_node(node["additionalProperties"])
    if "properties" in node:
        out["properties"] = {k: discovery_node(v) for k, v in node["properties"].items()}
        out["additionalProperties"] = False
        required = [k for k, v in node["properties"].items()
                    if v.get("description", "").startswith("Required.") and not (
                        node.get("id") == GEMINI_ROOT and k == "model")]
        if required:
            out["required"] = required
    for key in ("description", "readOnly", "deprecated"):
        if key in node:
            out[key] = node[key]
    return out


def gemini_from_discovery(path: Path, ref: str | None, out_dir: Path) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    schemas = document["schemas"]
    defs, todo = {}, [GEMINI_ROOT]
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        defs[name] = discovery_node(schemas[name])
        todo.extend(r.rsplit("/", 1)[1] for r in refs_in(defs[name], set()))
    source = f"{ref or path.name} (revision {document.get('revision')})"
    write(out_dir / "gemini.generate_content.schema.json",
          gemini_document(defs, source, "the discovery document"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--openai", type=Path, help="OpenAI's openapi.json")
    ap.add_argument("--openai-ref", help="where it came from, e.g. openai/openai-openapi@COMMIT:openapi.json")
    ap.add_argument("--anthropic", action="store_true", help="from the installed anthropic SDK")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gemini-protos", type=Path, help="root of a googleapis/googleapis tree")
    g.add_argument("--gemini-discovery", type=Path, help="a generativelanguage v1beta discovery document")
    ap.add_argument("--gemini-ref", help="where the Gemini source came from, e.g. googleapis/googleapis@COMMIT")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    if not (args.openai or args.anthropic or args.gemini_protos or args.gemini_discovery):
        ap.error("nothing to do: give --openai, --anthropic, --gemini-protos or --gemini-discovery")
    if args.openai:
        openai(args.openai, args.openai_ref, args.out)
    if args.anthropic:
        anthropic_schema(args.out)
    if args.gemini_protos:
        gemini_from_protos(args.gemini_protos, args.gemini_ref, args.out)
    if args.gemini_discovery:
        gemini_from_discovery(args.gemini_discovery, args.gemini_ref, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
