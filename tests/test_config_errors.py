"""The feed/fetch config parser: every malformed config is one line naming the line it is on, never a
traceback; strings are UTF-8 with protobuf's escapes; duplicate and negative ids are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from models import dense_relu

from aotc.config import load_config, parse_config
from aotc.errors import AotcError

FETCH = 'fetch { id { node_name: "y" } }'
DEEP = "feed " + "{ id " * 5000 + "}" * 5000

# config text -> the error it gives (after "config line N: ").
BAD = {
    'fetch {\n  id { node_name: "y" output_index: "a" }\n}': (2, 'output_index must be an integer, got "a"'),
    f'feed {{ id {{ node_name: "x" }}\n shape {{ dim {{ size: 4.5 }} }} }}\n{FETCH}':
        (2, "size must be an integer, got 4.5"),
    'fetch { id: "y" }': (1, 'id must be a message { ... }, got "y"'),
    f'feed {{ id {{ node_name: "x" }} shape: 5 }}\n{FETCH}': (1, "shape must be a message { ... }, got 5"),
    f'{FETCH}\nfetch {{ id {{ node_name: "a\\qb" }} }}': (2, 'string "a\\qb" has an unknown escape \\q'),
    f'{FETCH}\nfetch {{ id {{ node_name: "\\xff" }} }}': (2, 'string "\\xff" is not valid UTF-8'),
    'fetch { id { node_name: "y } }': (1, 'string \'"y } }\' is not closed on its line'),
    DEEP: (1, "unknown field 'id' in an id (known: node_name, output_index)"),
    "{" * 5000: (1, "expected a field name, got {"),
    'fetch { id { node_name: "y" output_index: -1 } }': (1, "output_index must be >= 0, got -1"),
    f'{FETCH}\n\nfetch {{ id {{ node_name: "y" }} name: "again" }}':
        (3, "fetch of 'y' output 0 given twice (first on line 1)"),
    'fetch { id { node_name: "y" } name: "o" }\nfetch { id { node_name: "z" } name: "o" }':
        (2, "two fetches named 'o' (the first on line 1)"),
    f'feed {{ id {{ node_name: "x" }} }}\nfeed {{ id {{ node_name: "x" }} }}\n{FETCH}':
        (2, "feed of 'x' output 0 given twice (first on line 1)"),
    f'feed {{ id {{ node_name: "a" }} name: "in" }}\nfeed {{ id {{ node_name: "b" }} name: "in" }}\n{FETCH}':
        (2, "two feeds named 'in' (the first on line 1)"),
    'fetch { id { node_name: "y" } name: "a"\n name: "b" }': (2, "name given twice in a fetch (first on line 1)"),
    f'{FETCH}\nfetch {{ id {{ node_name: "y" output_index: 99999999999999999999 }} }}':
        (2, "output_index 99999999999999999999 does not fit in 64 bits"),
    'fetch { id { node_name: "y" output_index: 010 } }': (1, "output_index must be an integer, got 010"),
    f'feed {{ id {{ node_name: "x" }} type: 1 }}\n{FETCH}': (1, "type must be a type name such as DT_FLOAT, got 1"),
    f'feed {{ id {{ node_name: "x" }} type: DT_NOPE }}\n{FETCH}': (1, "unknown dtype 'DT_NOPE'"),
    f'feed {{ id {{ node_name: "x" }} shape {{ unknown_rank: true }} }}\n{FETCH}':
        (1, "feed 'x' has an unknown dimension; aotc needs static shapes"),
    f'{FETCH}\nfetch {{ id {{ node_name: "z" }} nmae: "typo" }}': (2, "unknown field 'nmae' in a fetch"),
    f'{FETCH} bogus: 1': (1, "unknown field 'bogus' in the config"),
    'feed { id { node_name: "x" }\n\n': (1, "unbalanced braces: the '{' of this line is never closed"),
    f'{FETCH}\nfetch {{ name: }}': (2, "name must be a single string value, got }"),
    'fetch { id { node_name: "y" } } @': (1, "cannot parse near '@'"),
}


@pytest.mark.parametrize("text", list(BAD), ids=range(len(BAD)))
def test_bad_config_is_one_error_naming_its_line(text):
    line, msg = BAD[text]
    with pytest.raises(AotcError) as e:
        parse_config(text)
    assert str(e.value).startswith(f"config line {line}: {msg}")
    assert "\n" not in str(e.value)


def test_cli_prints_one_line_naming_the_file_and_line(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(dense_relu(m=1, k=4, n=2).SerializeToString())
    cases = ['fetch { id { node_name: "y" output_index: "a" } }', 'feed { id { node_name: "x" } shape { dim {'
             ' size: 4.5 } } }', 'fetch { id: "y" }', 'feed { id { node_name: "x" } shape: 5 }',
             'fetch { id { node_name: "\\q" } }', DEEP]
    for k, text in enumerate(cases):
        cfg = tmp_path / f"c{k}.pbtxt"
        cfg.write_text("# the config\n" + text)
        proc = subprocess.run([sys.executable, "-m", "aotc", "compile", str(model), "-o", str(tmp_path / "o"),
                               "-c", str(cfg)], capture_output=True, text=True)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"aotc: error: config {cfg}, line 2: "), proc.stderr


def test_strings_are_utf8_with_protobuf_escapes():
    cfg = parse_config('feed { id { node_name: "caf\\303\\251 \\u00e9t\\xc3\\xa9 ü" } name: "a" \'b\' }\n'
                       'fetch < id < node_name: "tab\\there\\"" output_index: 0x2 > >; variable { node_name: "v" }')
    assert cfg.feeds[0].id.node_name == "café été ü"
    assert cfg.feeds[0].name == "ab"  # adjacent strings concatenate
    assert cfg.fetches[0].id.node_name == 'tab\there"' and cfg.fetches[0].id.output_index == 2


def test_load_config_names_the_file(tmp_path):
    path = tmp_path / "c.pbtxt"
    path.write_text('fetch { id { node_name: "y" } }\nfetch { id { node_name: "y" output_index: -3 } }')
    with pytest.raises(AotcError, match=rf"^config {path}, line 2: output_index must be >= 0, got -3$"):
        load_config(path)
