"""The ``glomo`` executable's fast ``--version`` and the package's names imported on use."""
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
                  "from glomo_pyg.console import main\n"
                  "assert main() == 0\n"
                  "print('torch' in sys.modules, 'torch_geometric' in sys.modules)")
    assert out.splitlines() == [f"glomo_pyg {__version__}", "False False"]


def test_version_line_equals_the_parsers(capsys):
    from glomo_pyg.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"glomo_pyg {__version__}"


def test_other_arguments_reach_the_full_command_line(monkeypatch, capsys):
    from glomo_pyg import console

    monkeypatch.setattr(sys, "argv", ["glomo", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        console.main()
    assert exit_info.value.code == 0 and "quickstart" in capsys.readouterr().out


def test_importing_the_package_leaves_torch_alone():
    assert _python("import sys, glomo_pyg\nprint('torch' in sys.modules)").strip() == "False"


def test_every_public_name_resolves_and_is_listed():
    for name in glomo_pyg.__all__:
        assert getattr(glomo_pyg, name) is not None
        assert name in dir(glomo_pyg)
    from glomo_pyg import GlomoConv
    from glomo_pyg.nn import GlomoConv as home

    assert GlomoConv is home
    with pytest.raises(AttributeError, match="no attribute 'GlomoConvv'"):
        glomo_pyg.GlomoConvv  # noqa: B018


def test_all_lists_exactly_the_lazy_names():
    assert sorted(glomo_pyg.__all__) == sorted(list(glomo_pyg._MODULE_OF) + ["__version__"])
