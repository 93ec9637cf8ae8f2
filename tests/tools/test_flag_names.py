"""One language across the tools: a flag name means one thing everywhere,
and an old name exits 2 with one line naming its new flag."""

import importlib

import pytest

from peat_jax.tools import _cli

TOOLS = ("analyze", "calibrate", "detect", "golden", "playback", "profile",
         "report", "runtime", "scaleout", "sites", "validate")

RENAMED = [
    ("golden", "--workdir=runs/cnn", "error: --workdir is now --campaign_dir:"
     " the golden run goes to <campaign_dir>/golden"),
    ("sites", "--model=cnn", "error: --model is now --scenario: the scenario "
     "whose train step is listed, as in the other tools"),
    ("sites", "--pattern=fwd/*", "error: --pattern is now --select: the "
     "fnmatch pattern narrowing the sites, as in the other tools"),
    ("playback", "--steps=0,2", "error: --steps is now --checkpoints: the "
     "checkpoint steps to play back, e.g. --checkpoints=0,10; --steps counts "
     "golden training steps only (peat-golden, peat-profile, peat-validate)"),
    ("scaleout", "--steps=0", "error: --steps is now --checkpoints: the "
     "checkpoint steps to play back"),
    ("runtime", "--steps=30", "error: --steps is now --runtime_steps: runtime "
     "FI steps per frequency; --steps counts golden training steps only"),
    ("calibrate", "--seeds=0", "error: --seeds is now --injection_seeds: the "
     "seeds of the injected errors"),
]


def _tool(name):
  return importlib.import_module(f"peat_jax.tools.{name}")


def _exit(name, argv, capsys):
  tool = _tool(name)
  with pytest.raises(SystemExit) as e:
    _cli.run(tool.main, tool.FLAGS, tool.__doc__, argv=[name] + argv)
  out = capsys.readouterr()
  return e.value.code, out.out, out.err


@pytest.mark.parametrize("name, flag, message", RENAMED)
def test_an_old_name_exits_2_naming_the_new_flag(name, flag, message, capsys):
  rc, _, err = _exit(name, ["--campaign_dir=/nonexistent", flag]
                     if name not in ("sites", "calibrate") else [flag],
                     capsys)
  assert rc == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), err


@pytest.mark.parametrize("argv", [["--workdir", "runs/cnn"], ["--noworkdir"],
                                  ["--workdir"]])
def test_every_form_of_an_old_name_is_refused(argv, capsys):
  rc, _, err = _exit("golden", argv, capsys)
  assert rc == 2 and err.startswith("error: --workdir is now --campaign_dir")


@pytest.mark.parametrize("name, flag", sorted({(n, f.split("=")[0])
                                               for n, f, _ in RENAMED}))
def test_help_lists_the_new_flags_not_the_old(name, flag, capsys):
  rc, out, _ = _exit(name, ["--helpshort"], capsys)
  assert rc == 0
  flag_lines = [line.split(":")[0].strip() for line in out.splitlines()
                if line.startswith("  --")]
  assert flag not in flag_lines and f"--[no]{flag[2:]}" not in flag_lines
  new = dict((f.split("=")[0], m.split(" is now ")[1].split(":")[0])
             for n, f, m in RENAMED if n == name)[flag]
  assert any(line.startswith(new) for line in flag_lines), out


def _flags(name):
  """``{flag name: help}`` of a tool's listed flags."""
  return {f.name: f.help for fs in _tool(name).FLAGS.flags_by_module_dict()
          .values() for f in fs}


def test_one_meaning_per_flag_name():
  every = {name: _flags(name) for name in TOOLS}
  meaning = {"steps": "golden training steps",
             "checkpoints": "checkpoint steps to play back",
             "runtime_steps": "runtime fi steps",
             "select": "fnmatch pattern narrowing",
             "campaign_dir": "campaign directory"}
  for name, fl in every.items():
    for flag, words in meaning.items():
      if flag in fl:
        assert words in fl[flag].lower(), (name, flag, fl[flag])
  campaign_tools = ("golden", "playback", "profile", "runtime", "scaleout",
                    "validate")
  task_flags = {"scenario", "batch_size", "overrides", "seed", "task"}
  for name in campaign_tools:
    assert task_flags <= set(every[name]) and "campaign_dir" in every[name]
  assert not {"workdir", "model", "pattern"} & set().union(*every.values())


@pytest.mark.parametrize("name", [n for n in TOOLS if isinstance(
    getattr(_tool(n), "_KUT", None), _cli.KutFlags)])
def test_kernel_help_lists_every_site_kernel_and_the_missing_one_error_too(
    name):
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  help_text = " ".join(_flags(name)["kernel"].split())
  listed = ", ".join(peat.kernels.SITE_KERNELS)
  assert listed in help_text
  with pytest.raises(peat.PeatError) as e:
    peat.kernels.parse_kut("py:json:dumps")
  assert listed in str(e.value)
