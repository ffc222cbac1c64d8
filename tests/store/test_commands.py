"""``kvscope runs`` and ``kvscope replay`` as plain functions and via argparse."""

import argparse

import pytest

from engine.store.commands import add_store_subcommands, cmd_replay, cmd_runs
from tests.store.test_store import record_run


@pytest.fixture()
def parser():
    p = argparse.ArgumentParser(prog="kvscope")
    add_store_subcommands(p.add_subparsers(dest="command"))
    return p


def run(parser, argv):
    args = parser.parse_args(argv)
    return args.func(args)


def test_runs_lists_labels_exports_imports_deletes(tmp_path, parser, capsys):
    db = str(tmp_path / "runs.sqlite")
    assert run(parser, ["runs", "--db", db]) == 0
    assert "no runs recorded yet" in capsys.readouterr().out
    run_id = record_run(db)
    assert run(parser, ["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert run_id in out and "4x4" in out and "demo" in out and "tiny" in out

    assert run(parser, ["runs", "--db", db, "--label", run_id, "best"]) == 0
    assert "best" in capsys.readouterr().out
    path = str(tmp_path / "r.jsonl")
    assert run(parser, ["runs", "--db", db, "--export", run_id, path]) == 0
    assert run(parser, ["runs", "--db", db, "--import", path]) == 0
    assert "imported" in capsys.readouterr().out
    assert run(parser, ["runs", "--db", db, "--delete", run_id]) == 0
    capsys.readouterr()
    assert run(parser, ["runs", "--db", db, "--delete", run_id]) == 1
    assert "no run" in capsys.readouterr().err


def test_replay_prints_grid_and_tables(tmp_path, parser, capsys):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db)
    assert run(parser, ["replay", run_id, "--step", "2", "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} (demo) | model tiny | step 2 of 1..3" in out
    assert "  0 ###." in out  # blocks 0, 1 (a) and 2 (b) in use
    assert "0->0 [4/4]  1->1 [3/4]" in out
    assert "metrics: kv_cache_usage 0.750" in out
    # called directly with a minimal Namespace, as the CLI would
    assert cmd_replay(argparse.Namespace(run_id=run_id, step=None, db=db)) == 0
    assert "step 3 of 1..3" in capsys.readouterr().out


def test_replay_errors(tmp_path, parser, capsys):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db)
    assert run(parser, ["replay", run_id, "--step", "9", "--db", db]) == 1
    assert "step 9 is out of range" in capsys.readouterr().err
    assert run(parser, ["replay", "missing", "--db", db]) == 1
    assert "no run 'missing'" in capsys.readouterr().err
    assert cmd_runs(argparse.Namespace(db=db)) == 0
