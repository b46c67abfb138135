"""Patch algorithms: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge patch and
server-side apply field ownership.

Schema-aware functions take a compiled ``validation.Node`` (duck-typed: ``props``, ``additional``, ``items``,
``map_keys``, ``list_type``, ``patch_key``, ``patch_strategy``) or None for schemaless data.

Field sets for server-side apply are Python sets of paths; a path is a tuple of elements:
``"f:name"`` (struct field / map key), ``"k:{json}"`` (item of a map-type list, by its key fields),
``"v:json"`` (item of a set-type list) and ``"."`` (the item itself). They are stored in
``metadata.managedFields[].fieldsV1`` in the upstream trie format.
"""

from __future__ import annotations

import json
from typing import Any


class PatchError(Exception):
    def __init__(self, message: str, code: int = 422):
        super().__init__(message)
        self.message = message
        self.code = code


def deep_copy(v):
    """Fast deep copy of JSON-like data (dicts, lists, scalars)."""
    t = type(v)
    if t is dict:
        return {k: (deep_copy(x) if type(x) in _CONTAINERS else x) for k, x in v.items()}
    if t is list:
        return [(deep_copy(x) if type(x) in _CONTAINERS else x) for x in v]
    if isinstance(v, dict):
        return {k: deep_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [deep_copy(x) for x in v]
    return v


_CONTAINERS = (dict, list)


# ================================================================================================ JSON patch
def _unescape(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


def _parse_pointer(ptr: str) -> list[str]:
    if not isinstance(ptr, str):
        raise PatchError(f"invalid JSON pointer {ptr!r}", 400)
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {ptr!r}", 400)
    return [_unescape(t) for t in ptr[1:].split("/")]


def _resolve_parent(doc, tokens: list[str], path: str):
    cur = doc
    for tok in tokens[:-1]:
        if isinstance(cur, dict):
            if tok not in cur:
                raise PatchError(f"doc is missing path: \"{path}\": missing value")
            cur = cur[tok]
        elif isinstance(cur, list):
            try:
                idx = int(tok)
            except ValueError:
                raise PatchError(f"invalid array index {tok!r} in {path}") from None
            if idx < 0 or idx >= len(cur):
                raise PatchError(f"doc is missing path: \"{path}\": missing value")
            cur = cur[idx]
        else:
            raise PatchError(f"doc is missing path: \"{path}\": missing value")
    return cur


def _get(doc, path: str):
    tokens = _parse_pointer(path)
    if not tokens:
        return doc
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"doc is missing path: \"{path}\": missing value")
        return parent[last]
    if isinstance(parent, list):
        try:
            idx = int(last)
        except ValueError:
            raise PatchError(f"invalid array index {last!r}") from None
        if idx < 0 or idx >= len(parent):
            raise PatchError(f"doc is missing path: \"{path}\": missing value")
        return parent[idx]
    raise PatchError(f"doc is missing path: \"{path}\": missing value")


def _add(doc, path: str, value):
    tokens = _parse_pointer(path)
    if not tokens:
        return value
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                idx = int(last)
            except ValueError:
                raise PatchError(f"invalid array index {last!r}") from None
            if idx < 0 or idx > len(parent):
                raise PatchError(f"Unable to access invalid index: {idx}")
            parent.insert(idx, value)
    else:
        raise PatchError(f"doc is missing path: \"{path}\": missing value")
    return doc


def _remove(doc, path: str):
    tokens = _parse_pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve_parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"Unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            idx = int(last)
        except ValueError:
            raise PatchError(f"invalid array index {last!r}") from None
        if idx < 0 or idx >= len(parent):
            raise PatchError(f"Unable to remove invalid index: {idx}")
        return parent.pop(idx)
    raise PatchError(f"doc is missing path: \"{path}\": missing value")


def json_patch(doc: dict, ops: list) -> dict:
    """Apply an RFC 6902 patch to a copy of ``doc``."""
    if not isinstance(ops, list):
        raise PatchError("json patch must be a list of operations", 400)
    doc = deep_copy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError(f"invalid operation {op!r}", 400)
        kind = op["op"]
        path = op.get("path")
        if path is None:
            raise PatchError(f"operation {kind!r} is missing path", 400)
        if kind == "add":
            if "value" not in op:
                raise PatchError("add operation does not apply: missing value", 400)
            doc = _add(doc, path, deep_copy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            if "value" not in op:
                raise PatchError("replace operation does not apply: missing value", 400)
            tokens = _parse_pointer(path)
            if not tokens:
                doc = deep_copy(op["value"])
                continue
            _get(doc, path)  # must exist
            parent = _resolve_parent(doc, tokens, path)
            last = tokens[-1]
            if isinstance(parent, dict):
                parent[last] = deep_copy(op["value"])
            else:
                parent[int(last)] = deep_copy(op["value"])
        elif kind == "move":
            frm = op.get("from")
            if frm is None:
                raise PatchError("move operation is missing from", 400)
            val = _remove(doc, frm)
            doc = _add(doc, path, val)
        elif kind == "copy":
            frm = op.get("from")
            if frm is None:
                raise PatchError("copy operation is missing from", 400)
            doc = _add(doc, path, deep_copy(_get(doc, frm)))
        elif kind == "test":
            try:
                cur = _get(doc, path)
            except PatchError:
                cur = None
            if not _json_equal(cur, op.get("value")):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}", 400)
    return doc


def _json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    return a == b


# ================================================================================================ merge patch
def merge_patch(doc, patch):
    """RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    out = deep_copy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            out[k] = merge_patch(out.get(k), v)
        else:
            out[k] = deep_copy(v)
    return out


# ================================================================================================ strategic merge patch
def _child(node, key):
    if node is None:
        return None
    props = getattr(node, "props", None)
    if props is not None and key in props:
        return props[key]
    a = getattr(node, "additional", None)
    if a is not None and a is not True:
        return a
    return None


def _merge_key(node):
    if node is None:
        return None
    if getattr(node, "patch_strategy", None) and "merge" in (node.patch_strategy or "") and node.patch_key:
        return node.patch_key
    return None


def _is_merge_list(node) -> bool:
    return node is not None and "merge" in (getattr(node, "patch_strategy", None) or "")


def strategic_merge_patch(doc, patch, node):
    """Strategic merge patch for built-in kinds (merge keys from the schema's x-kubernetes-patch-* hints)."""
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object", 400)
    return _smp_map(deep_copy(doc) if isinstance(doc, dict) else {}, patch, node)


def _smp_map(out: dict, patch: dict, node):
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: deep_copy(v) for k, v in patch.items() if k != "$patch" and not k.startswith("$")}
    if directive == "delete":
        return None
    retain = patch.get("$retainKeys")
    order_hints = {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys"):
            continue
        if k.startswith("$setElementOrder/"):
            order_hints[k.split("/", 1)[1]] = v
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            cur = out.get(field)
            if isinstance(cur, list) and isinstance(v, list):
                out[field] = [x for x in cur if x not in v]
            continue
        child = _child(node, k)
        if v is None:
            out.pop(k, None)
            continue
        cur = out.get(k)
        if isinstance(v, dict):
            if getattr(child, "free_form", False) and "$patch" not in v:
                out[k] = merge_patch(cur, v) if isinstance(cur, dict) else deep_copy(v)
                continue
            res = _smp_map(deep_copy(cur) if isinstance(cur, dict) else {}, v, child)
            if res is None:
                out.pop(k, None)
            else:
                out[k] = res
        elif isinstance(v, list):
            out[k] = _smp_list(cur if isinstance(cur, list) else [], v, child)
        else:
            out[k] = v
    if isinstance(retain, list):
        keep = set(retain)
        for k in list(out.keys()):
            if k not in keep:
                del out[k]
    for field, order in order_hints.items():
        cur = out.get(field)
        if isinstance(cur, list) and isinstance(order, list):
            out[field] = _apply_order(cur, order, _merge_key(_child(node, field)))
    return out


def _apply_order(cur: list, order: list, key):
    def ident(x):
        if key and isinstance(x, dict):
            return json.dumps(x.get(key), sort_keys=True)
        return json.dumps(x, sort_keys=True)

    pos = {ident(o): i for i, o in enumerate(order)}
    listed = [x for x in cur if ident(x) in pos]
    listed.sort(key=lambda x: pos[ident(x)])
    rest = [x for x in cur if ident(x) not in pos]
    return listed + rest


def _smp_list(cur: list, patch: list, node):
    # {"$patch": "replace"} item replaces the whole list
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [deep_copy(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    if not _is_merge_list(node):
        return [deep_copy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    key = node.patch_key
    item_node = getattr(node, "items", None)
    if key is None:  # primitive list with merge strategy (e.g. finalizers): union
        out = list(cur)
        for p in patch:
            if isinstance(p, dict) and p.get("$patch") == "delete":
                continue
            if p not in out:
                out.append(deep_copy(p))
        return out
    out = [deep_copy(x) for x in cur]
    for p in patch:
        if not isinstance(p, dict):
            out.append(deep_copy(p))
            continue
        kv = p.get(key)
        idx = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == kv), None)
        if p.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(_smp_map({}, p, item_node))
        else:
            merged = _smp_map(out[idx], p, item_node)
            if merged is None:
                out.pop(idx)
            else:
                out[idx] = merged
    return out


# ================================================================================================ SSA field sets
def _key_elem(item: dict, keys) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys if k in item}, separators=(",", ":"), sort_keys=True)


def _list_keys(node):
    if node is None:
        return None, None
    lt = getattr(node, "list_type", None)
    mk = getattr(node, "map_keys", ()) or ()
    if lt == "map" and mk:
        return "map", mk
    if lt == "set":
        return "set", None
    if getattr(node, "patch_key", None) and "merge" in (getattr(node, "patch_strategy", None) or ""):
        return "map", (node.patch_key,)
    if lt is None and "merge" in (getattr(node, "patch_strategy", None) or ""):
        return "set", None
    return "atomic", None


def field_set(value, node, prefix: tuple = ()) -> set:
    """Leaf paths of ``value`` (see module doc)."""
    out: set = set()
    _fields(value, node, prefix, out)
    return out


def _fields(value, node, prefix, out):
    if isinstance(value, dict):
        if not value or (node is not None and getattr(node, "map_type_atomic", False)):
            if prefix:
                out.add(prefix)
            return
        for k, v in value.items():
            _fields(v, _child(node, k), prefix + ("f:" + k,), out)
    elif isinstance(value, list):
        kind, keys = _list_keys(node)
        if kind == "map" and value and all(isinstance(x, dict) for x in value):
            item_node = getattr(node, "items", None)
            for item in value:
                p = prefix + (_key_elem(item, keys),)
                out.add(p + (".",))
                for k, v in item.items():
                    _fields(v, _child(item_node, k), p + ("f:" + k,), out)
        elif kind == "set" and value and not any(isinstance(x, (dict, list)) for x in value):
            for item in value:
                out.add(prefix + ("v:" + json.dumps(item, separators=(",", ":")),))
        else:
            out.add(prefix)
    else:
        out.add(prefix)


def lookup(value, path: tuple):
    """Value at an SSA path (``_MISSING`` if absent)."""
    cur = value
    for el in path:
        if el == ".":
            return cur
        if el.startswith("f:"):
            if not isinstance(cur, dict) or el[2:] not in cur:
                return _MISSING
            cur = cur[el[2:]]
        elif el.startswith("k:"):
            if not isinstance(cur, list):
                return _MISSING
            kv = json.loads(el[2:])
            cur = next((x for x in cur if isinstance(x, dict) and all(x.get(k) == v for k, v in kv.items())), _MISSING)
            if cur is _MISSING:
                return _MISSING
        elif el.startswith("v:"):
            if not isinstance(cur, list):
                return _MISSING
            v = json.loads(el[2:])
            return v if v in cur else _MISSING
        else:
            return _MISSING
    return cur


class _Missing:
    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()


def remove_path(value, path: tuple) -> None:
    """Remove the field/item at ``path`` from ``value`` (in place); empty parents are left alone."""
    if not path:
        return
    if path[-1] == ".":
        path = path[:-1]
    parent = lookup(value, path[:-1]) if len(path) > 1 else value
    if parent is _MISSING:
        return
    el = path[-1]
    if el.startswith("f:") and isinstance(parent, dict):
        parent.pop(el[2:], None)
    elif el.startswith("k:") and isinstance(parent, list):
        kv = json.loads(el[2:])
        for i, x in enumerate(parent):
            if isinstance(x, dict) and all(x.get(k) == v for k, v in kv.items()):
                parent.pop(i)
                break
    elif el.startswith("v:") and isinstance(parent, list):
        v = json.loads(el[2:])
        if v in parent:
            parent.remove(v)


def path_str(path: tuple) -> str:
    """``.spec.containers[name="a"].image`` style rendering used in conflict messages."""
    out = []
    for el in path:
        if el == ".":
            continue
        if el.startswith("f:"):
            out.append("." + el[2:])
        elif el.startswith("k:"):
            kv = json.loads(el[2:])
            out.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in kv.items()) + "]")
        elif el.startswith("v:"):
            out.append("[" + el[2:] + "]")
    return "".join(out)


# ---------------------------------------------------------------- fieldsV1 encoding
def encode_fields(paths: set) -> dict:
    trie: dict = {}
    for p in sorted(paths):
        cur = trie
        for el in p:
            cur = cur.setdefault(el, {})
    return trie


def decode_fields(trie: dict | None, prefix: tuple = ()) -> set:
    out: set = set()
    if not isinstance(trie, dict):
        return out
    for k, v in trie.items():
        p = prefix + (k,)
        if isinstance(v, dict) and v:
            out |= decode_fields(v, p)
        else:
            out.add(p)
    return out


# ---------------------------------------------------------------- apply merge
def apply_merge(live, applied, node):
    """Merge an applied configuration into the live value (map-lists merged by key, atomic lists replaced)."""
    if isinstance(applied, dict):
        if not isinstance(live, dict):
            live = {}
        out = dict(live)
        for k, v in applied.items():
            if v is None:
                out.pop(k, None)
                continue
            out[k] = apply_merge(live.get(k), v, _child(node, k))
        return out
    if isinstance(applied, list):
        kind, keys = _list_keys(node)
        if kind == "map" and isinstance(live, list) and all(isinstance(x, dict) for x in applied):
            item_node = getattr(node, "items", None)
            out = []
            used = set()
            for a in applied:
                ka = _key_elem(a, keys)
                idx = next((i for i, x in enumerate(live) if isinstance(x, dict) and _key_elem(x, keys) == ka), None)
                if idx is None:
                    out.append(apply_merge(None, a, item_node))
                else:
                    used.add(idx)
                    out.append(apply_merge(live[idx], a, item_node))
            for i, x in enumerate(live):  # items owned by others stay (after the applied ones)
                if i not in used:
                    out.append(deep_copy(x))
            return out
        if kind == "set" and isinstance(live, list):
            out = [deep_copy(x) for x in applied]
            for x in live:
                if x not in out:
                    out.append(deep_copy(x))
            return out
        return deep_copy(applied)
    return applied


# ---------------------------------------------------------------- managedFields helpers
IGNORED_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                "generateName", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds")


def trackable(obj: dict, *, status_only: bool = False, drop_status: bool = False) -> dict:
    """The part of an object that field ownership covers."""
    out = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind"):
            continue
        if k == "metadata":
            if status_only:
                continue
            m = {mk: mv for mk, mv in (v or {}).items() if mk not in IGNORED_META}
            if m:
                out["metadata"] = m
            continue
        if status_only and k != "status":
            continue
        if drop_status and k == "status":
            continue
        out[k] = v
    return out


def managed_entries(obj: dict) -> list[dict]:
    mf = (obj.get("metadata") or {}).get("managedFields")
    return mf if isinstance(mf, list) else []


def ownership(obj: dict) -> dict[tuple[str, str, str], set]:
    """(manager, operation, subresource) -> decoded field set."""
    out = {}
    for e in managed_entries(obj):
        if not isinstance(e, dict):
            continue
        key = (e.get("manager", ""), e.get("operation", "Update"), e.get("subresource", ""))
        out[key] = out.get(key, set()) | decode_fields(e.get("fieldsV1"))
    return out


def build_entries(own: dict, api_version: str, times: dict, now: str) -> list[dict]:
    entries = []
    for (mgr, op, sub), fields in own.items():
        if not fields:
            continue
        e = {"manager": mgr, "operation": op, "apiVersion": api_version, "time": times.get((mgr, op, sub), now),
             "fieldsType": "FieldsV1", "fieldsV1": encode_fields(fields)}
        if sub:
            e["subresource"] = sub
        entries.append(e)
    return entries


def entry_times(obj: dict) -> dict:
    return {(e.get("manager", ""), e.get("operation", "Update"), e.get("subresource", "")): e.get("time")
            for e in managed_entries(obj) if isinstance(e, dict)}


def _descendant_or_same(a: tuple, b: tuple) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def find_conflicts(own: dict, me: tuple, applied_fields: set, applied_obj: dict, live_obj: dict) -> list[tuple]:
    """[(manager_key, path)] for fields another manager owns with a different value."""
    conflicts = []
    for key, fields in own.items():
        if key[0] == me[0] and key[1] == me[1]:
            continue
        common = applied_fields & fields
        for p in sorted(common):
            if p and p[-1] == ".":
                continue
            a = lookup(applied_obj, p)
            b = lookup(live_obj, p)
            if a is _MISSING or b is _MISSING:
                continue
            if a != b:
                conflicts.append((key, p))
    return conflicts


def server_side_apply(live: dict | None, applied: dict, manager: str, node, *, force: bool, api_version: str, now: str,
                      subresource: str | None = None, status_subresource: bool = False):
    """Returns (new_object, conflicts). ``live`` None = create. Status handling:
    on the main resource of kinds with a status subresource the applied status is ignored; on ``status`` only status is."""
    live = live or {}
    status_only = subresource == "status"
    drop_status = status_subresource and not status_only
    applied_t = trackable(applied, status_only=status_only, drop_status=drop_status)
    applied_fields = field_set(applied_t, node)
    own = ownership(live)
    times = entry_times(live)
    me = (manager, "Apply", subresource or "")
    conflicts = find_conflicts(own, me, applied_fields, applied_t, live)
    if conflicts and not force:
        return None, conflicts
    if conflicts:
        for key, p in conflicts:
            own[key] = {f for f in own[key] if not _descendant_or_same(f, p)}
    prev = own.get(me, set())
    # merge
    new = apply_merge(live, applied_t, node)
    for k in ("apiVersion", "kind"):
        if k in live:
            new[k] = live[k]
        elif k in applied:
            new[k] = applied[k]
    meta = dict(live.get("metadata") or {})
    meta.update(new.get("metadata") or {})
    for k in ("name", "namespace", "generateName"):
        if k not in meta and k in (applied.get("metadata") or {}):
            meta[k] = applied["metadata"][k]
    new["metadata"] = meta
    # removal of fields no longer applied by this manager and not owned by anyone else
    others = set()
    for key, fields in own.items():
        if key != me:
            others |= fields
    removed = prev - applied_fields
    still_owned = others | applied_fields
    for p in sorted(removed, key=lambda x: (len(x), x)):
        if any(_descendant_or_same(o, p) for o in others):
            continue
        if p[-1] == ".":
            # the item itself: only if nobody else owns anything under it
            base = p[:-1]
            if any(o[: len(base)] == base for o in still_owned):
                continue
        elif len(p) >= 2 and p[-2].startswith("k:") and p[-1].startswith("f:") and p[-1][2:] in json.loads(p[-2][2:]):
            continue  # key fields of a list item go with the item
        remove_path(new, p)
    own[me] = applied_fields
    for key in list(own):
        if not own[key]:
            del own[key]
    times[me] = now
    new["metadata"]["managedFields"] = build_entries(own, api_version, times, now)
    if not new["metadata"]["managedFields"]:
        del new["metadata"]["managedFields"]
    return new, []


def record_update(old: dict | None, new: dict, manager: str, node, *, api_version: str, now: str,
                  subresource: str | None = None, status_subresource: bool = False) -> None:
    """Update ``new.metadata.managedFields`` for a non-apply write by ``manager`` (in place)."""
    meta = new.setdefault("metadata", {})
    if old is not None:
        old_mf = (old.get("metadata") or {}).get("managedFields")
        new_mf = meta.get("managedFields")
        if new_mf is not None and new_mf != old_mf:
            # the client rewrote managedFields explicitly: take it as is ([] clears tracking)
            if not new_mf:
                meta.pop("managedFields", None)
            return
        own = ownership(old)
        times = entry_times(old)
    else:
        own, times = {}, {}
    status_only = subresource == "status"
    drop_status = status_subresource and not status_only
    old_f = _leaf_values(trackable(old, status_only=status_only, drop_status=drop_status), node) if old else {}
    new_f = _leaf_values(trackable(new, status_only=status_only, drop_status=drop_status), node)
    changed = {p for p, v in new_f.items() if old_f.get(p, _MISSING) != v}
    gone = set(old_f) - set(new_f)
    if changed or gone:
        me = (manager, "Update", subresource or "")
        for key in list(own):
            if key != me:
                own[key] = {f for f in own[key] if f not in changed and f not in gone}
        own[me] = (own.get(me, set()) - gone) | changed
        for key in list(own):
            if not own[key]:
                del own[key]
        times[me] = now
    entries = build_entries(own, api_version, times, now)
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def _leaf_values(obj, node) -> dict:
    fs = field_set(obj, node)
    out = {}
    for p in fs:
        v = lookup(obj, p) if p[-1] != "." else True
        out[p] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
    return out


def ssa_conflict_causes(conflicts, api_version_of=lambda key: "v1") -> tuple[str, list[dict]]:
    causes = []
    for key, p in conflicts:
        ps = path_str(p)
        causes.append({"type": "FieldManagerConflict", "message": f'conflict with "{key[0]}"'
                       + (f" using {api_version_of(key)}" if api_version_of else "") + f": {ps}", "field": ps})
    if len(causes) == 1:
        msg = f"Apply failed with 1 conflict: {causes[0]['message']}"
    else:
        msg = f"Apply failed with {len(causes)} conflicts: " + "\n".join(c["message"] for c in causes)
    return msg, causes


def any_changed(a: Any, b: Any) -> bool:
    return a != b
