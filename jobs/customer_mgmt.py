"""Parse CustomerMgmt.xml (Batch1) into typed actions: read with Python's XML parser, typed in Arrow.

`read_actions` reads the `TPCDI:Action` elements of one file with the standard library's parser (expat, through
`xml.etree.ElementTree`) in one streaming pass, one text column per declared field (`schemas.sources`'
`CUSTOMER_MGMT_ACTION` and `CUSTOMER_MGMT_XML`); `check_actions` types them with the rules of every other source
(`jobs.fields`). The read replaces one by Spark's XML reader, which took 4.5 s of SF 3's 18 s staging and was the
only reason staging needed a JVM (this one: about 0.4 s), and gives the same table, value for value:
- one row per action, in file order: `action_seq` is its 1-based position in the file;
- a value is the text exactly as written (surrounding spaces kept, entities and CDATA decoded, comments left
  out); an element or attribute that is present but empty gives '', an absent one NULL. `check_actions` types an
  empty (or blank) value as NULL like an absent one but lists it in `present_fields`, so that UPDCUST/UPDACCT can
  tell "set to NULL" from "unchanged";
- as Spark's reader did: an element that occurs twice where one is declared gives its last occurrence, an element
  declared as text that holds elements gives them as markup (`a<b>c</b>`), text in a group (`Name`, `Address`,
  ...) is ignored, and `Account` is a list: the account columns come from the first one and `_accounts` counts
  them (-1 for none, Spark's `size` of a missing list), so an action with several accounts is seen (and rejected)
  rather than cut;
- `_as_read` is the action as compact JSON, the text Spark's `to_json` gave: declared fields in declaration order,
  attributes as `_NAME`, absent ones left out, `Account` as a list.
The row tag's `TPCDI` prefix is matched through the namespace the file binds it to.

Malformed XML is rejected action by action (`_corrupt` and `_as_read` hold the text, every field is NULL). A file
that is not well-formed is read a second time, cut at each `<TPCDI:Action` start tag: an action runs to its end
tag (to the next action or the end of the file when that is missing) and is parsed alone, with the `TPCDI`
namespace declared. An action that does not parse, or that is followed by text (not only whitespace, comments and
tags) before the next one, is one corrupt row; so is such text before the first action (a malformed file without
actions is one corrupt row); the other actions keep their values and positions. In that pass actions are found
by their tags' text, so one inside a comment or CDATA section would be read.

Deliberate differences from Spark's reader, all on files TPC-DI does not produce: on malformed XML it returned the
actions before the first error, then one corrupt record holding the whole file's text, and dropped every action
after it; bytes that are not UTF-8 failed the whole read (here: that action is corrupt); an entity declared in
the file's DTD made it corrupt (here it is decoded); it matched names by their prefix, not their namespace, so
under a default namespace (`xmlns="..."`) it still found `Customer` (here its fields are absent); an action inside
an action was not a row of its own (here it is, before its parent).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple
from xml.etree import ElementTree

import pyarrow as pa
import pyarrow.compute as pc

from jobs import fields
from schemas.sources import (
    CUSTOMER_MGMT_ACTION,
    CUSTOMER_MGMT_ACTIONS,
    CUSTOMER_MGMT_NAMESPACE,
    CUSTOMER_MGMT_ROW_TAG,
    CUSTOMER_MGMT_XML,
)
from schemas.staging import CUSTOMER_MGMT
from streamdi.collector import read_landed

_ACCOUNT = "Account"  # read as a list, so that an action with several accounts is seen (and rejected)
_FIELDS = (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)
_PREFIX, _LOCAL = CUSTOMER_MGMT_ROW_TAG.split(":")
# Bytes parsed at a time: with small pieces few elements are alive when the garbage collector runs (SF 3: 0.4 s
# in 4 KB pieces, 0.6 s in 64 KB, 0.9 s in 1 MB).
_FEED = 4096
_TO_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # Spark's to_json: compact, UTF-8

# The second pass over a malformed file (bytes): an action's start tag, its end tag, the start tag as a whole
# (attribute values may hold '>'), and what may follow an action's end before the next action.
_START = re.compile(rb"<" + re.escape(CUSTOMER_MGMT_ROW_TAG.encode()) + rb"(?=[\s/>])")
_END = re.compile(rb"</" + re.escape(CUSTOMER_MGMT_ROW_TAG.encode()) + rb"\s*>")
_START_TAG = re.compile(
    rb"<" + re.escape(CUSTOMER_MGMT_ROW_TAG.encode()) + rb"""(?:\s+[^\s=/>]+\s*=\s*(?:"[^"]*"|'[^']*'))*\s*(/?)>"""
)
_MARKUP_ONLY = re.compile(rb"(?:\s|<!--(?:[^-]|-(?!-))*-->|<(?!!--)[^<>&]*>)*\Z")
_WRAP = (f'<{_PREFIX}:Actions xmlns:{_PREFIX}="{CUSTOMER_MGMT_NAMESPACE}">'.encode(), f"</{_PREFIX}:Actions>".encode())


class _Member(NamedTuple):
    """A declared attribute or element of a group: its name in the XML and its key in `_as_read`; a text value's
    column, or an element's own group."""

    name: str
    key: str
    attribute: bool
    column: int | None
    group: _Group | None


@dataclass(frozen=True)
class _Group:
    """An element of the action's layout (the action itself, `Customer`, `Name`, ...) and its declared members, in
    declaration order (the order of `_as_read`)."""

    members: tuple[_Member, ...]
    has_elements: bool


def _layout() -> _Group:
    """The declared paths as a tree of groups (`@NAME` = attribute, `_NAME` in JSON), in declaration order."""
    tree: dict = {}
    for column, f in enumerate(_FIELDS):
        node = tree
        *parents, leaf = f.path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = column

    def group(node: dict) -> _Group:
        members = []
        for name, value in node.items():
            attribute = name.startswith("@")
            column, sub = (value, None) if isinstance(value, int) else (None, group(value))
            members.append(_Member(name.lstrip("@"), name.replace("@", "_", 1), attribute, column, sub))
        return _Group(tuple(members), any(not m.attribute for m in members))

    return group(tree)


_LAYOUT = _layout()


def read_actions(path: str) -> pa.Table:
    """The actions of one CustomerMgmt.xml file as `raw_actions` gives them."""
    return raw_actions(read_landed(path))


def raw_actions(xml: bytes) -> pa.Table:
    """The `TPCDI:Action` elements of a CustomerMgmt.xml file's bytes, flattened: `action_seq` (1-based position in
    the file), one text column per declared field (NULL when absent, '' when present and empty), `_accounts`
    (Account elements, -1 for none), `_corrupt` (the text of an action the parser could not read, else NULL) and
    `_as_read` (the action as JSON, or that text)."""
    try:
        actions = [_flatten(action) for action in _actions(xml)]
    except ElementTree.ParseError:
        actions = list(_actions_one_by_one(xml))
    n = len(actions)
    values = list(zip(*(a[0] for a in actions), strict=True)) if n else [()] * len(_FIELDS)
    columns = {"action_seq": pa.array(range(1, n + 1), pa.int64())}
    for f, column in zip(_FIELDS, values, strict=True):
        columns[f.name] = pa.array(column, pa.string())
    columns["_accounts"] = pa.array([a[1] for a in actions], pa.int32())
    columns["_corrupt"] = pa.array([a[2] for a in actions], pa.string())
    columns["_as_read"] = pa.array([a[3] for a in actions], pa.string())
    never_null = ("action_seq", "_accounts")  # the types and nullability Spark's read gave
    return pa.table(columns, pa.schema([pa.field(k, v.type, k not in never_null) for k, v in columns.items()]))


def check_actions(raw: pa.Table) -> pa.Table:
    """Type `raw_actions` rows: the columns of `staging.customermgmt` without lineage (the declared fields,
    `present_fields`, `action_seq`), the lineage columns, `line` (the action as read, for a rejected one; NULL
    for a good one) and `reason` ('' for a good action)."""
    own = {"action_seq", "_accounts", "_corrupt", "_as_read", *(f.name for f in _FIELDS)}
    passthrough = [c for c in raw.column_names if c not in own]
    problems, typed, present_names = fields.Problems(raw.num_rows), {}, []
    for f in _FIELDS:
        text = raw[f.name].combine_chunks().cast(pa.large_string())
        filled = pc.fill_null(text, "")
        present = pc.not_equal(pc.utf8_trim(filled, characters=" "), "")
        typed[f.name] = fields.type_column(problems, filled, present, CUSTOMER_MGMT.column(f.name))
        if f is CUSTOMER_MGMT_ACTION[0]:  # the action type's own check: one of the known types
            unknown = pc.and_(pc.is_valid(text), pc.invert(pc.is_in(text, pa.array(CUSTOMER_MGMT_ACTIONS))))
            known = ", ".join(CUSTOMER_MGMT_ACTIONS)
            problems.add(unknown, ("action_type: '", filled, f"' is not one of {known}"))
        if f in CUSTOMER_MGMT_XML:
            present_names.append(pc.if_else(pc.is_valid(text), pa.scalar(f",{f.name}", pa.large_string()), ""))
    accounts = raw["_accounts"].combine_chunks()
    problems.add(
        pc.greater(pc.fill_null(accounts, -1), 1),
        (accounts.cast(pa.string()), " Account elements, at most one expected"),
    )
    corrupt = pc.is_valid(raw["_corrupt"].combine_chunks())
    reason = pc.if_else(
        corrupt,
        pa.scalar("malformed XML: the reader could not parse this action", pa.large_string()),
        problems.reason(),
    )
    present_fields = pc.utf8_slice_codeunits(fields.join(*present_names), 1)
    as_read = raw["_as_read"].combine_chunks().cast(pa.large_string())
    out = pa.table(typed)
    out = out.append_column("present_fields", present_fields).append_column("action_seq", raw["action_seq"])
    for name in passthrough:
        out = out.append_column(name, raw[name])
    line = pc.if_else(pc.equal(reason, ""), pa.scalar(None, pa.large_string()), as_read)
    return out.append_column("line", line).append_column("reason", reason)


_Action = tuple[tuple[str | None, ...], int, str | None, str]  # (field values, _accounts, _corrupt, _as_read)


def _actions(xml: bytes) -> Iterator[ElementTree.Element]:
    """The row-tag elements of a well-formed file, in document order, each freed once the caller has read it;
    raises `ParseError` where the file is not well-formed."""
    row_tag = None  # the row tag as ElementTree names it, once the file binds its prefix to a namespace
    for event, item in _events(xml):
        if event == "start-ns":
            if item[0] == _PREFIX:
                row_tag = f"{{{item[1]}}}{_LOCAL}"
        elif item.tag == row_tag:
            yield item
            item.clear()


def _events(xml: bytes) -> Iterator[tuple[str, Any]]:
    """The parser's namespace declarations and element ends, read block by block."""
    parser = ElementTree.XMLPullParser(events=("start-ns", "end"))
    for start in range(0, len(xml), _FEED):
        parser.feed(xml[start : start + _FEED])
        yield from parser.read_events()
    parser.close()
    yield from parser.read_events()


def _actions_one_by_one(xml: bytes) -> Iterator[_Action]:
    """The actions of a file that is not well-formed, cut at each action's start tag and parsed alone."""
    starts = [m.start() for m in _START.finditer(xml)]
    head = xml[: starts[0]] if starts else xml
    if _MARKUP_ONLY.match(head) is None:
        yield _corrupt(head)
    for start, following in itertools.pairwise([*starts, len(xml)]):
        piece = xml[start:following]
        length = _action_length(piece)
        text = piece[:length]
        try:
            wrapper = ElementTree.fromstring(_WRAP[0] + text + _WRAP[1])
        except ElementTree.ParseError:
            wrapper = None
        if wrapper is None or len(wrapper) != 1 or _MARKUP_ONLY.match(piece, length) is None:
            yield _corrupt(piece if wrapper is not None else text)
        else:
            yield _flatten(wrapper[0])


def _action_length(piece: bytes) -> int:
    """Where the action that opens `piece` ends: after its start tag if that closes it (`<TPCDI:Action .../>`),
    else after its first end tag, else (no end tag) at the end of the piece."""
    tag = _START_TAG.match(piece)
    if tag is not None and tag.group(1):
        return tag.end()
    end = _END.search(piece)
    return len(piece) if end is None else end.end()


def _corrupt(text: bytes) -> _Action:
    raw = text.decode("utf-8", errors="backslashreplace")  # shown as read: an invalid byte as \xNN
    return (None,) * len(_FIELDS), -1, raw, raw


def _flatten(action: ElementTree.Element) -> _Action:
    values: list[str | None] = [None] * len(_FIELDS)
    read = _group(action, _LAYOUT, values)
    accounts = len(read.get("Customer", {}).get(_ACCOUNT, ())) or -1  # -1 for none, like Spark's size(NULL)
    return tuple(values), accounts, None, _TO_JSON(read)


def _group(element: ElementTree.Element, layout: _Group, values: list[str | None]) -> dict:
    """The declared members of one element as Spark's reader read them: a JSON object in declaration order, without
    the absent ones; text values are also written to `values` (the first Account's only)."""
    read: dict = {}
    last = {child.tag: child for child in element} if layout.has_elements else {}  # a repeated element: its last
    for name, key, attribute, column, sub in layout.members:
        if attribute:
            value = element.get(name)
            if value is None:
                continue
        else:
            child = last.get(name)
            if child is None:
                continue
            if sub is not None:
                if name == _ACCOUNT:
                    first, *others = element.findall(name)
                    scratch = [None] * len(_FIELDS)
                    read[key] = [_group(first, sub, values), *(_group(a, sub, scratch) for a in others)]
                else:
                    read[key] = _group(child, sub, values)
                continue
            value = _text(child) if len(child) else child.text or ""
        read[key] = value
        values[column] = value
    return read


def _text(element: ElementTree.Element) -> str:
    """The text of an element that holds elements, as Spark's reader read it: the elements kept as markup."""
    parts = [element.text or ""]
    for child in element:
        attributes = "".join(f' {k}="{v}"' for k, v in child.attrib.items())
        inner = _text(child) if len(child) else child.text or ""
        parts.append(f"<{child.tag}{attributes}>{inner}</{child.tag}>{child.tail or ''}")
    return "".join(parts)
