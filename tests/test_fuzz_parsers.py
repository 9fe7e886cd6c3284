"""Property-based fuzzing of the topology parsers: hwloc XML, synthetic descriptions, CPU lists and
node sets. For any input a parser returns a result or raises UsageError (one line) - never another
exception, never a RecursionError, never a hang."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilewise import cpulist
from tilewise.errors import UsageError
from tilewise.topology import hwloc_xml, synthetic

# TILEWISE_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps this file at a few seconds
EXAMPLES = int(os.environ.get("TILEWISE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def one_line(e: UsageError) -> bool:
    return "\n" not in str(e) and str(e).strip() != ""


def survives(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except UsageError as e:
        assert one_line(e), repr(str(e))
        return None


# ---- CPU lists and node sets ----------------------------------------------------------------------

NUMS = st.one_of(st.integers(0, 70).map(str), st.sampled_from(["N", "99999999999", "9" * 5000, "-1", "", "x", "²"]))
ITEM = st.one_of(
    NUMS,
    st.tuples(NUMS, NUMS).map("-".join),
    st.tuples(NUMS, NUMS, NUMS, NUMS).map(lambda t: f"{t[0]}-{t[1]}:{t[2]}/{t[3]}"),
)
LIST_TEXT = st.one_of(
    st.lists(ITEM, min_size=0, max_size=5).map(",".join),
    st.text(alphabet="0123456789-,:/N!+al ", max_size=20),
    st.text(max_size=12),
    st.sampled_from(["all", "ALL", "!1", "+0-1", "!+0", "!all", "+all", "!", "+", "!+", "0-15:2/4", "16-N"]),
)


@FUZZ
@given(text=LIST_TEXT, last=st.one_of(st.none(), st.integers(0, 64)))
def test_cpulist_parse_any_text(text, last):
    out = survives(cpulist.parse, text, what="--cpus", last=last)
    if out is not None:
        assert list(out) == sorted(set(out)) and all(0 <= c < cpulist.MAX_ID for c in out)
        if last is not None and "N" in text and "all" not in text.lower():
            assert last in out or all(c <= last for c in out)


@FUZZ
@given(text=LIST_TEXT, allowed=st.lists(st.integers(0, 16), min_size=1, max_size=8, unique=True))
def test_node_sets_any_text(text, allowed):
    out = survives(cpulist.parse_set, text, allowed, what="--mem-nodes")
    if out is not None and (text.strip().startswith(("!", "+")) or text.strip().lower() == "all"):
        assert set(out) <= set(allowed)  # relative forms stay inside the allowed set


def test_kernel_and_numactl_grammar():
    assert cpulist.parse("0-15:2/4") == (0, 1, 4, 5, 8, 9, 12, 13)
    assert cpulist.parse("100-200:2/25") == (100, 101, 125, 126, 150, 151, 175, 176, 200)
    assert cpulist.parse("16-N", last=19) == (16, 17, 18, 19) and cpulist.parse("all", last=3) == (0, 1, 2, 3)
    assert cpulist.parse("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    for bad in ("0-7:2", "3-1", "0-7:0/4", "0-7:5/4", "N", "all", "1,,2", "0x3", " , "):
        with pytest.raises(UsageError):
            cpulist.parse(bad)
    nodes = [0, 1, 2, 3]
    assert cpulist.parse_set("all", nodes) == (0, 1, 2, 3)
    assert cpulist.parse_set("!1", nodes) == (0, 2, 3) and cpulist.parse_set("!0-1", nodes) == (2, 3)
    assert cpulist.parse_set("+0-1", [2, 3, 6]) == (2, 3) and cpulist.parse_set("+N", [2, 3, 6]) == (6,)
    assert cpulist.parse_set("!+0", [2, 3, 6]) == (3, 6)
    for bad in ("+4", "!all", "!0-3", "+", "!", "!+N-0"):
        with pytest.raises(UsageError):
            cpulist.parse_set(bad, nodes)


# ---- synthetic descriptions -------------------------------------------------------------------------

LEVEL = st.sampled_from(["Package", "Socket", "Die", "Group", "NUMANode", "L3Cache", "L2Cache", "L1dCache", "Core",
                         "PU", "Machine", "Bogus", "L3"])
COUNT = st.one_of(st.integers(0, 5).map(str), st.sampled_from(["99999999", "9" * 5000, "", "x", "²"]))
ATTR = st.sampled_from(["", "(memory=64GB)", "(size=32MB)", "(size=1e999GB)", "(size=" + "9" * 400 + "GB)",
                        "(indexes=0,2,1,3)", "(indexes=" + "9" * 30 + ")", "(memory=x)", "(bogus)", "(", ")",
                        "(indexes=²)", "(size=12.5KiB)"])
TOKEN = st.one_of(
    st.tuples(LEVEL, COUNT, ATTR).map(lambda t: f"{t[0]}:{t[1]}{t[2]}"),
    st.sampled_from(["[NUMANode]", "[NUMANode(memory=16GB)]", "[Core]", "[", "]", "[NUMANode(memory=)]"]),
)
DESC = st.one_of(st.lists(TOKEN, max_size=7).map(" ".join), st.text(max_size=30))


@FUZZ
@given(desc=DESC)
def test_synthetic_any_description(desc):
    t = survives(synthetic.load, desc)
    if t is not None:
        assert t.pus and len(t.pus) <= 65536


def test_synthetic_any_depth_and_size():
    deep = " ".join(["Die:1"] * 1500) + " PU:2"  # deeper than Python's recursion limit
    assert len(synthetic.load(deep).pus) == 2  # no RecursionError
    for desc in ["(" * 20000, "Package:2" + "(" * 5000, "x" * 200_000, "Core:" + "9" * 5000 + " PU:1",
                 "PU:1(size=" + "9" * 5000 + ")", "a(" * 4999, "[" * 9999, "Core:2( PU:1"]:
        with pytest.raises(UsageError):
            synthetic.load(desc)


# ---- hwloc XML ----------------------------------------------------------------------------------

TYPES = ["Machine", "Package", "Socket", "Group", "NUMANode", "MemCache", "L3Cache", "Cache", "Core", "PU", "Misc",
         "Die", "Bogus", ""]
VALUES = st.one_of(st.integers(0, 8).map(str), st.sampled_from(["-1", "x", "", "1e3", "9" * 30, "²", "0x10", " 3 "]))
MASKS = st.sampled_from(["0x00000003", "0xff,0x00000001", "zz", "", "0x", "0x" + "f" * 200, ",,"])


@st.composite
def xml_tree(draw, depth=0):
    attrs = {"type": draw(st.sampled_from(TYPES))}
    for key in ("os_index", "cache_size", "local_memory", "depth", "cache_type"):
        if draw(st.booleans()):
            attrs[key] = draw(VALUES)
    if draw(st.integers(0, 5)) == 0:
        attrs["subtype"] = draw(st.sampled_from(["CXL-DRAM", "HBM", "x"]))
    e = ET.Element("object", attrs)
    if depth < 4:
        for child in draw(st.lists(xml_tree(depth=depth + 1), max_size=3)):
            e.append(child)
    return e


@st.composite
def xml_doc(draw):
    root = ET.Element("topology", {"version": "2.0"})
    machine = draw(xml_tree())
    if draw(st.booleans()):
        machine.set("allowed_cpuset", draw(MASKS))
    root.append(machine)
    for _ in range(draw(st.integers(0, 2))):
        d = ET.SubElement(root, "distances2", {"type": draw(st.sampled_from(["NUMANode", "PU"])),
                                               "nbobjs": draw(VALUES), "indexing": draw(st.sampled_from(["os", "gp"]))})
        if draw(st.booleans()):
            d.set("name", draw(st.sampled_from(["tilewise:latency_ns", "x"])))
        ET.SubElement(d, "indexes").text = " ".join(draw(st.lists(VALUES, max_size=3)))
        ET.SubElement(d, "u64values").text = " ".join(draw(st.lists(VALUES, max_size=9)))
    return ET.tostring(root, encoding="unicode")


@FUZZ
@given(text=st.one_of(xml_doc(), st.text(max_size=40), st.sampled_from(["<topology/>", "<a>", "<topology><object/></topology>"])))
def test_hwloc_xml_any_document(text):
    t = survives(hwloc_xml.load, "fuzz.xml", text=text)
    if t is not None:
        assert t.pus


def test_hwloc_xml_any_depth():
    depth = 20000
    sets = 'cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1"'
    body = f'<object type="Group" {sets}>' * depth + f'<object type="PU" os_index="0" {sets}/>' + "</object>" * depth
    text = (f'<topology version="2.0"><object type="Machine" os_index="0" {sets}>'
            f'<object type="NUMANode" os_index="0" local_memory="1024" {sets}/>{body}</object></topology>')
    t = hwloc_xml.load("deep.xml", text=text)  # no RecursionError
    assert t.pus == (0,)


@pytest.mark.parametrize("attr", ['os_index="x"', 'os_index="-1"', 'os_index="' + "9" * 40 + '"', 'os_index="²"'])
def test_hwloc_xml_malformed_attribute_is_one_line(attr):
    sets = 'cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1"'
    text = (f'<topology version="2.0"><object type="Machine" {sets}><object type="NUMANode" os_index="0" {sets}/>'
            f'<object type="Core" os_index="0" {sets}><object type="PU" {attr} {sets}/></object></object></topology>')
    with pytest.raises(UsageError, match="malformed os_index"):
        hwloc_xml.load("bad.xml", text=text)
