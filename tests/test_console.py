"""The ``glomo`` executable's fast ``--version`` (glomo_cli, outside the package)."""
import subprocess
import sys

import pytest

import glomo_pyg
from glomo_pyg.version import __version__


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout


def test_version_does_not_import_torch():
    out = _python("import sys; sys.argv = ['glomo', '--version']\n"
                  "from glomo_cli import main\n"
                  "assert main() == 0\n"
                  "print('torch' in sys.modules, 'torch_geometric' in sys.modules)")
    assert out.splitlines() == [f"glomo_pyg {__version__}", "False False"]


def test_version_line_equals_the_parsers(capsys):
    from glomo_pyg.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"glomo_pyg {__version__}"


def test_other_arguments_reach_the_full_command_line(monkeypatch, capsys):
    import glomo_cli

    monkeypatch.setattr(sys, "argv", ["glomo", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        glomo_cli.main()
    assert exit_info.value.code == 0 and "quickstart" in capsys.readouterr().out


def test_every_public_name_resolves():
    for name in glomo_pyg.__all__:
        assert getattr(glomo_pyg, name) is not None
