"""CustomerMgmt.xml read without Spark (`jobs.customer_mgmt.read_actions`): every value as written, '' for a present
but empty element or attribute, NULL for an absent one, and a malformed action rejected alone.

Files are written by hand; every expected value is typed in here, never computed by the reader.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from jobs.customer_mgmt import check_actions, read_actions
from schemas.sources import CUSTOMER_MGMT_ACTION, CUSTOMER_MGMT_XML

HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<TPCDI:Actions xmlns:TPCDI="http://www.tpc.org/tpc-di">\n'
TAIL = "</TPCDI:Actions>\n"
TEXT_COLUMNS = [f.name for f in (*CUSTOMER_MGMT_ACTION, *CUSTOMER_MGMT_XML)]


def _action(customer: str, kind: str = "NEW", ts: str = "2007-07-07T10:00:00") -> str:
    return f'\t<TPCDI:Action ActionType="{kind}" ActionTS="{ts}">\n\t\t{customer}\n\t</TPCDI:Action>\n'


def _read(tmp_path: Path, text: str) -> list[dict]:
    path = tmp_path / "CustomerMgmt.xml"
    path.write_bytes(text.encode())
    return read_actions(str(path)).to_pylist()


def _values(row: dict) -> dict:
    """The text columns that are not NULL."""
    return {k: v for k, v in row.items() if k in TEXT_COLUMNS and v is not None}


def test_present_but_empty_is_empty_text_and_absent_is_null(tmp_path: Path):
    customer = (
        '<Customer C_ID="3" C_TIER="">'
        "<Name><C_L_NAME>Joannis</C_L_NAME><C_M_NAME/></Name>"
        "<Address><C_ADLINE2></C_ADLINE2><C_CITY>Columbus</C_CITY></Address>"
        "</Customer>"
    )
    (row,) = _read(tmp_path, HEAD + _action(customer, "UPDCUST") + TAIL)
    assert _values(row) == {
        "action_type": "UPDCUST",
        "action_ts": "2007-07-07T10:00:00",
        "c_id": "3",
        "c_tier": "",
        "c_l_name": "Joannis",
        "c_m_name": "",
        "c_adline2": "",
        "c_city": "Columbus",
    }
    assert (row["c_dob"], row["c_f_name"], row["c_adline1"], row["ca_id"]) == (None, None, None, None)
    assert (row["action_seq"], row["_accounts"], row["_corrupt"]) == (1, -1, None)


def test_text_is_kept_exactly_as_written(tmp_path: Path):
    customer = (
        '<Customer C_ID="4" C_TAX_ID=" 923-54-6498 ">'
        "<Name><C_L_NAME> Joannis</C_L_NAME><C_F_NAME>Ada  </C_F_NAME><C_M_NAME>   </C_M_NAME></Name>"
        '<Account CA_ID="7"><CA_NAME> SBujiXiyq</CA_NAME></Account>'
        "</Customer>"
    )
    (row,) = _read(tmp_path, HEAD + _action(customer) + TAIL)
    assert (row["c_tax_id"], row["c_l_name"], row["c_f_name"], row["c_m_name"], row["ca_name"]) == (
        " 923-54-6498 ",
        " Joannis",
        "Ada  ",
        "   ",
        " SBujiXiyq",
    )


def test_entities_and_cdata_are_decoded(tmp_path: Path):
    customer = (
        '<Customer C_ID="5" C_TAX_ID="&lt;1&gt; &quot;2&quot;">'
        "<Name><C_L_NAME>O&apos;Brien &amp; Sons</C_L_NAME><C_F_NAME>Ren&#233;e</C_F_NAME>"
        "<C_M_NAME><![CDATA[<M>]]></C_M_NAME></Name>"
        "</Customer>"
    )
    (row,) = _read(tmp_path, HEAD + _action(customer) + TAIL)
    assert (row["c_tax_id"], row["c_l_name"], row["c_f_name"], row["c_m_name"]) == (
        '<1> "2"',
        "O'Brien & Sons",
        "Renée",
        "<M>",
    )


def test_accounts_are_counted_and_the_first_one_gives_the_values(tmp_path: Path):
    two = (
        '<Customer C_ID="7"><Account CA_ID="71" CA_TAX_ST="1"><CA_B_ID>10</CA_B_ID></Account>'
        '<Account CA_ID="72"/></Customer>'
    )
    one = '<Customer C_ID="7"><Account CA_ID="73"/></Customer>'
    none = '<Customer C_ID="7"></Customer>'
    rows = _read(tmp_path, HEAD + _action(two, "ADDACCT") + _action(one, "CLOSEACCT") + _action(none, "INACT") + TAIL)
    assert [(r["_accounts"], r["ca_id"], r["ca_tax_st"], r["ca_b_id"]) for r in rows] == [
        (2, "71", "1", "10"),
        (1, "73", None, None),
        (-1, None, None, None),
    ]


def test_as_read_is_the_action_as_compact_json(tmp_path: Path):
    customer = (
        '<Customer C_ID="7" C_TIER="">'
        "<Address><C_ADLINE2/><C_CITY>Augusta &amp; Co</C_CITY></Address>"
        '<Account CA_ID="71"><CA_NAME> a "b"</CA_NAME></Account><Account/>'
        "</Customer>"
    )
    (row,) = _read(tmp_path, HEAD + _action(customer, "UPDACCT") + TAIL)
    assert row["_as_read"] == (
        '{"_ActionType":"UPDACCT","_ActionTS":"2007-07-07T10:00:00","Customer":{"_C_ID":"7","_C_TIER":"",'
        '"Address":{"C_ADLINE2":"","C_CITY":"Augusta & Co"},'
        '"Account":[{"_CA_ID":"71","CA_NAME":" a \\"b\\""},{}]}}'
    )


def test_a_malformed_action_is_rejected_alone(tmp_path: Path):
    bad = (
        '<TPCDI:Action ActionType="NEW" ActionTS="2007-07-07T11:00:00">\n'
        '\t\t<Customer C_ID="9"><Name><C_L_NAME>x</C_F_NAME></Name></Customer>\n'
        "\t</TPCDI:Action>"
    )
    text = (
        HEAD
        + _action('<Customer C_ID="8"><Name><C_L_NAME>Before</C_L_NAME></Name></Customer>', "NEW")
        + "\t"
        + bad
        + "\n"
        + _action('<Customer C_ID="10"><Account CA_ID="100"/></Customer>', "ADDACCT")
        + TAIL
    )
    rows = _read(tmp_path, text)
    assert [(r["action_seq"], r["action_type"], r["c_id"], r["c_l_name"], r["ca_id"]) for r in rows] == [
        (1, "NEW", "8", "Before", None),
        (2, None, None, None, None),
        (3, "ADDACCT", "10", None, "100"),
    ]
    assert [(r["_corrupt"], r["_as_read"]) for r in rows[1:2]] == [(bad, bad)]
    assert _values(rows[1]) == {}
    assert [r["_corrupt"] for r in (rows[0], rows[2])] == [None, None]


def test_an_action_cut_off_at_the_end_of_the_file_is_rejected(tmp_path: Path):
    cut = '<TPCDI:Action ActionType="INACT" ActionTS="2007-07-08T10:00:00">\n\t\t<Customer C_ID="8"/>\n'
    rows = _read(tmp_path, HEAD + _action('<Customer C_ID="7"/>', "INACT") + "\t" + cut)
    assert [(r["action_seq"], r["c_id"], r["_corrupt"]) for r in rows] == [(1, "7", None), (2, None, cut)]


def test_a_malformed_file_without_actions_is_one_rejected_row(tmp_path: Path):
    rows = _read(tmp_path, "<TPCDI:Actions><broken")
    assert [(r["action_seq"], r["_corrupt"], r["_as_read"]) for r in rows] == [
        (1, "<TPCDI:Actions><broken", "<TPCDI:Actions><broken")
    ]
    assert _read(tmp_path, HEAD + TAIL) == []


def test_a_repeated_element_gives_its_last_occurrence_and_markup_inside_a_value_is_kept(tmp_path: Path):
    customer = (
        '<Customer C_ID="7"><Name><C_L_NAME>First</C_L_NAME><C_L_NAME>Second</C_L_NAME>'
        "<C_F_NAME>a<b>c</b>d</C_F_NAME></Name></Customer>"
    )
    (row,) = _read(tmp_path, HEAD + _action(customer) + TAIL)
    assert (row["c_l_name"], row["c_f_name"]) == ("Second", "a<b>c</b>d")


def test_columns_have_the_types_check_actions_reads(tmp_path: Path):
    path = tmp_path / "CustomerMgmt.xml"
    path.write_text(HEAD + _action('<Customer C_ID="7"/>', "INACT") + TAIL)
    raw = read_actions(str(path))
    assert raw.column_names == ["action_seq", *TEXT_COLUMNS, "_accounts", "_corrupt", "_as_read"]
    assert raw.schema.field("action_seq").type == pa.int64()
    assert raw.schema.field("_accounts").type == pa.int32()
    assert {raw.schema.field(c).type for c in [*TEXT_COLUMNS, "_corrupt", "_as_read"]} == {pa.string()}


def test_check_actions_tells_empty_from_absent(tmp_path: Path):
    """An empty value is typed NULL like an absent one, but only the empty one is listed as present."""
    path = tmp_path / "CustomerMgmt.xml"
    customer = '<Customer C_ID="7" C_TIER=""><Address><C_ADLINE2/><C_CITY>Augusta</C_CITY></Address></Customer>'
    path.write_text(HEAD + _action(customer, "UPDCUST") + TAIL)
    (row,) = check_actions(read_actions(str(path))).to_pylist()
    assert (row["c_tier"], row["c_adline2"], row["c_adline1"], row["c_city"]) == (None, None, None, "Augusta")
    assert (row["present_fields"], row["reason"], row["line"]) == ("c_id,c_tier,c_adline2,c_city", "", None)
