"""Decode Kubernetes protobuf request bodies (``application/vnd.kubernetes.protobuf``) into the JSON form.

A body is the 4-byte magic ``k8s\\x00`` and a ``runtime.Unknown`` message: 1 TypeMeta {1 apiVersion, 2 kind},
2 raw (the object's own message), 3 contentEncoding, 4 contentType. The object's message is decoded with the
field tables of ``protowire_schema`` (numbers from the upstream ``generated.proto`` files) into the dict a JSON
body of the same object gives, so both go through the same create/update path. Zero values follow Go's JSON:
a zero scalar of a non-pointer ``omitempty`` field is dropped, a pointer's zero is kept (``replicas: 0``),
a zero ``Time`` is dropped, an inline struct's fields join its parent's, ``bytes`` become base64, ``Quantity``/``IntOrString``/``Duration`` their string
or number forms, ``RawExtension``/``FieldsV1`` their embedded JSON.

Pure standard library, no Django. Errors: :class:`ProtobufError` (malformed body, a 400) and
:class:`UnsupportedKind` (a kind without a table here, a 415).
"""

from __future__ import annotations

import base64
import json
import struct
from datetime import datetime, timedelta, UTC

from .protowire_schema import KINDS, MESSAGES

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

VARINT, FIXED64, LEN, GROUP_START, GROUP_END, FIXED32 = 0, 1, 2, 3, 4, 5
REPEATED, POINTER, OMITEMPTY, INLINE = 1, 2, 4, 8
MAX_DEPTH = 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_GO_ZERO_TIME = -62135596800  # seconds of Go's zero time.Time (0001-01-01T00:00:00Z)
_NUMERIC = {"int32", "int64", "uint32", "uint64", "bool", "double", "float"}


class ProtobufError(ValueError):
    """The body is not a valid Kubernetes protobuf envelope or object."""


class UnsupportedKind(ProtobufError):
    """The envelope names a kind this decoder has no field table for."""

    def __init__(self, api_version: str, kind: str):
        super().__init__(f"protobuf is not supported for {api_version or '<no apiVersion>'}, Kind={kind or '<no kind>'}")
        self.api_version, self.kind = api_version, kind


# -- the wire ------------------------------------------------------------------------------------------------------

def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """-> (value, next position); at most 10 bytes, as protobuf allows."""
    value = shift = 0
    for i in range(10):
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if i == 9:
            break
    raise ProtobufError("varint longer than 10 bytes")


def iter_fields(buf: bytes):
    """Yield ``(field number, wire type, value)``: an int for varint/fixed32/fixed64, bytes for length-delimited."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
        elif wire == FIXED64:
            if pos + 8 > end:
                raise ProtobufError("truncated fixed64")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise ProtobufError("truncated fixed32")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        elif wire == LEN:
            n, pos = read_varint(buf, pos)
            if pos + n > end:
                raise ProtobufError(f"field {number}: length {n} runs past the end of the message")
            value, pos = bytes(buf[pos:pos + n]), pos + n
        else:
            raise ProtobufError(f"field {number}: unsupported wire type {wire}")
        yield number, wire, value


# -- scalars -----------------------------------------------------------------------------------------------------

def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _scalar(typ: str, wire: int, value, where: str):
    if typ in ("string", "bytes"):
        if wire != LEN:
            raise ProtobufError(f"{where}: expected a length-delimited {typ}, got wire type {wire}")
        if typ == "bytes":
            return base64.b64encode(value).decode("ascii")
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtobufError(f"{where}: string is not valid UTF-8") from None
    if typ == "double":
        if wire != FIXED64:
            raise ProtobufError(f"{where}: expected fixed64, got wire type {wire}")
        return struct.unpack("<d", value.to_bytes(8, "little"))[0]
    if typ == "float":
        if wire != FIXED32:
            raise ProtobufError(f"{where}: expected fixed32, got wire type {wire}")
        return struct.unpack("<f", value.to_bytes(4, "little"))[0]
    if wire != VARINT:
        raise ProtobufError(f"{where}: expected a varint {typ}, got wire type {wire}")
    if typ == "bool":
        return value != 0
    if typ == "int32":
        return _signed(value, 32)
    if typ == "int64":
        return _signed(value, 64)
    if typ == "uint32":
        return value & 0xFFFFFFFF
    if typ == "uint64":
        return value
    raise ProtobufError(f"{where}: unknown scalar type {typ}")


def _packed(typ: str, data: bytes, where: str) -> list:
    out, pos = [], 0
    while pos < len(data):
        if typ == "double":
            out.append(struct.unpack_from("<d", data, pos)[0])
            pos += 8
        elif typ == "float":
            out.append(struct.unpack_from("<f", data, pos)[0])
            pos += 4
        else:
            v, pos = read_varint(data, pos)
            out.append(_scalar(typ, VARINT, v, where))
    if pos != len(data):
        raise ProtobufError(f"{where}: truncated packed field")
    return out


def _zero(typ: str):
    return {"string": "", "bytes": "", "bool": False}.get(typ, 0 if typ in _NUMERIC else None)


# -- the special messages (their JSON form is not an object) -------------------------------------------------------

def _fields_of(buf: bytes, where: str) -> dict[int, tuple[int, object]]:
    return {n: (w, v) for n, w, v in iter_fields(buf)}


def _int_field(f: dict, n: int, bits: int, where: str) -> int:
    if n not in f:
        return 0
    return _signed(_scalar("int64", f[n][0], f[n][1], where), bits)


def _str_field(f: dict, n: int, where: str) -> str:
    return _scalar("string", f[n][0], f[n][1], where) if n in f else ""


def _time(buf: bytes, where: str, micro: bool):
    f = _fields_of(buf, where)
    seconds, nanos = _int_field(f, 1, 64, where), _int_field(f, 2, 32, where)
    if seconds == _GO_ZERO_TIME and nanos == 0 or not f:
        return None
    try:
        t = _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        raise ProtobufError(f"{where}: time out of range") from None
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def go_duration(ns: int) -> str:
    """Go's ``time.Duration.String``: ``1h2m3.5s``, ``1.5s``, ``250ms``, ``0s``."""
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)

    def frac(v: int, unit: int) -> str:
        whole, rest = divmod(v, unit)
        if not rest:
            return str(whole)
        digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
        return f"{whole}.{digits}"

    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{frac(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{frac(ns, 1_000_000)}ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + f"{frac(rest, 1_000_000_000)}s"


def _raw_json(buf: bytes, where: str):
    f = _fields_of(buf, where)
    if 1 not in f or not f[1][1]:
        return None
    wire, raw = f[1]
    if wire != LEN:
        raise ProtobufError(f"{where}: expected length-delimited raw bytes")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ProtobufError(f"{where}: embedded raw object is not JSON") from None


def _special(name: str, buf: bytes, where: str):
    if name == "meta.v1.Time":
        return _time(buf, where, micro=False)
    if name == "meta.v1.MicroTime":
        return _time(buf, where, micro=True)
    if name == "meta.v1.Duration":
        return go_duration(_int_field(_fields_of(buf, where), 1, 64, where))
    if name == "resource.Quantity":
        return _str_field(_fields_of(buf, where), 1, where) or "0"
    if name == "intstr.IntOrString":
        f = _fields_of(buf, where)
        if _int_field(f, 1, 64, where) == 1:
            return _str_field(f, 3, where)
        return _int_field(f, 2, 32, where)
    if name in ("meta.v1.FieldsV1", "runtime.RawExtension"):
        return _raw_json(buf, where)
    raise ProtobufError(f"{where}: no decoder for message {name}")  # pragma: no cover - the schema names only these


_SPECIAL = {"meta.v1.Time", "meta.v1.MicroTime", "meta.v1.Duration", "resource.Quantity", "intstr.IntOrString",
            "meta.v1.FieldsV1", "runtime.RawExtension"}


# -- messages ------------------------------------------------------------------------------------------------------

def _value(typ: str, wire: int, value, where: str, depth: int):
    if typ in _SPECIAL or typ in MESSAGES:
        if wire != LEN:
            raise ProtobufError(f"{where}: expected an embedded message, got wire type {wire}")
        if typ in _SPECIAL:
            return _special(typ, value, where)
        return decode_message(value, typ, depth + 1, where)
    return _scalar(typ, wire, value, where)


def _map_entry(ktyp: str, vtyp: str, buf: bytes, where: str, depth: int):
    key = _zero(ktyp)
    val = _zero(vtyp) if vtyp not in MESSAGES and vtyp not in _SPECIAL else None
    seen_val = False
    for n, w, v in iter_fields(buf):
        if n == 1:
            key = _scalar(ktyp, w, v, where + "{key}")
        elif n == 2:
            val, seen_val = _value(vtyp, w, v, f"{where}[{key}]", depth), True
    if not seen_val and (vtyp in MESSAGES):
        val = {}
    elif not seen_val and vtyp == "resource.Quantity":
        val = "0"
    return key, val


def decode_message(buf: bytes, message: str, depth: int = 0, where: str = "") -> dict:
    """Decode one message of the schema into its JSON dict (unknown field numbers are skipped, as Go does)."""
    if depth > MAX_DEPTH:
        raise ProtobufError("messages nested too deeply")
    table = MESSAGES[message]
    out: dict = {}
    for number, wire, value in iter_fields(buf):
        spec = table.get(number)
        if spec is None:
            continue
        name, typ, flags = spec
        here = f"{where}.{name}" if where else name
        if typ.startswith("map:"):
            _, ktyp, vtyp = typ.split(":", 2)
            if wire != LEN:
                raise ProtobufError(f"{here}: expected a map entry, got wire type {wire}")
            k, v = _map_entry(ktyp, vtyp, value, here, depth)
            out.setdefault(name, {})[k] = v
        elif flags & REPEATED:
            items = out.setdefault(name, [])
            if wire == LEN and typ in _NUMERIC:
                items.extend(_packed(typ, value, here))
            else:
                items.append(_value(typ, wire, value, f"{here}[{len(items)}]", depth))
        else:
            out[name] = _value(typ, wire, value, here, depth)
    for name, typ, flags in table.values():
        if name not in out or flags & REPEATED or typ.startswith("map:"):
            continue
        v = out[name]
        if flags & INLINE and isinstance(v, dict):
            del out[name]  # json:",inline": Go's JSON puts the embedded struct's fields in the parent
            for k, val in v.items():
                out.setdefault(k, val)
        elif v is None:
            del out[name]  # a zero Time, an empty RawExtension: null in Go's JSON
        elif flags & OMITEMPTY and not flags & POINTER and typ not in MESSAGES and v == _zero(typ) \
                and not isinstance(v, dict):
            del out[name]
    return out


def decode_envelope(data: bytes) -> tuple[str, str, bytes]:
    """-> (apiVersion, kind, raw object bytes) of a ``k8s\\x00`` + ``runtime.Unknown`` body."""
    if not data.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    api_version = kind = content_encoding = ""
    raw = b""
    for n, w, v in iter_fields(data[len(MAGIC):]):
        if n == 1:
            if w != LEN:
                raise ProtobufError("typeMeta: expected an embedded message")
            for tn, tw, tv in iter_fields(v):
                if tn == 1:
                    api_version = _scalar("string", tw, tv, "typeMeta.apiVersion")
                elif tn == 2:
                    kind = _scalar("string", tw, tv, "typeMeta.kind")
        elif n == 2:
            if w != LEN:
                raise ProtobufError("raw: expected bytes")
            raw = v
        elif n == 3:
            content_encoding = _scalar("string", w, v, "contentEncoding")
        elif n == 4:
            content_type = _scalar("string", w, v, "contentType")
            if content_type and content_type.split(";")[0].strip() != MEDIA_TYPE:
                raise ProtobufError(f"unsupported contentType {content_type!r} in the envelope")
    if content_encoding:
        raise ProtobufError(f"unsupported contentEncoding {content_encoding!r} in the envelope")
    return api_version, kind, raw


def message_for(api_version: str, kind: str) -> str | None:
    """The schema message of a kind, or None. DeleteOptions is accepted under every group version, as upstream."""
    if kind == "DeleteOptions":
        return "meta.v1.DeleteOptions"
    return KINDS.get((api_version, kind))


def decode_object(data: bytes) -> dict:
    """A whole protobuf request body -> the JSON dict of the object (``apiVersion`` and ``kind`` first)."""
    api_version, kind, raw = decode_envelope(data)
    message = message_for(api_version, kind)
    if message is None:
        raise UnsupportedKind(api_version, kind)
    obj: dict = {"apiVersion": api_version, "kind": kind}
    obj.update(decode_message(raw, message))
    return obj


def supported_kinds() -> list[str]:
    """``apiVersion/Kind`` of every kind with a table, for error messages and docs."""
    return [f"{av}, Kind={k}" for av, k in KINDS]
