"""The app stays inside its roots (its acceptance test: a root holding every way out).

A model root holds, next to two good models and good data: model folders whose index names a
shard `../../outside/...` or by an absolute path, one whose `sub/x.safetensors` shard is a
link out of the root, one whose image processor file links out; data files that link out
(`leak.txt`, `leak.csv`), an image folder whose class folder links out, a datasets folder
(save_to_disk) and a parquet folder whose files link out. The app-facing library (what the
pages call: app_roots.discover / discover_data / resolve_choice / resolve_data, and
rotviz.app's Resources and computations) leaves every one of them unlisted and refuses it
in one line, and no file outside the root is opened meanwhile: a watcher records every open
(Python's `open` audit event, which builtins.open, io.open and os.open raise, and, on Linux,
inotify on the outside folders, which sees opens by native code too).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest

from rotviz import app
from rotviz.app import roots as app_roots
from rotviz.errors import RotvizError
from rotviz.random_models import save_random

VIT = dict(layers=2, d=32, heads=4, ffn=64, image=8, patch=2, channels=1, labels=10)
ROWS = [{"text": f"logging row {i}", "label": "logging"} for i in range(30)]

# ---- the watcher -------------------------------------------------------------------------------

_WATCHING: list[list] = []  # the record of the watch under way, if any (audit hooks stay)


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            _WATCHING[-1].append((event, os.fsdecode(path)))


sys.addaudithook(_audit)

IN_ACCESS, IN_OPEN = 0x1, 0x20


class Watcher:
    """What is opened or listed while it watches: paths from the audit hook, and inotify's
    open and access events on the `folders` (by any code in the process, native included)."""

    def __init__(self, folders: list[Path]):
        self.folders = folders
        self.seen: list = []
        self.fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self.fd = libc.inotify_init1(os.O_NONBLOCK)
            for f in folders:
                if libc.inotify_add_watch(self.fd, os.fsencode(f), IN_OPEN | IN_ACCESS) < 0:
                    raise OSError(ctypes.get_errno(), "inotify_add_watch")
        except (OSError, AttributeError):
            self.fd = -1  # no inotify here: the audit hook alone

    def __enter__(self) -> Watcher:
        _WATCHING.append(self.seen)
        return self

    def __exit__(self, *exc) -> None:
        _WATCHING.remove(self.seen)

    def native_events(self) -> list[tuple[int, str]]:
        """(mask, name) of the inotify events so far (name empty for the folder itself)."""
        if self.fd < 0:
            return []
        out = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            i = 0
            while i < len(data):
                _, mask, _, size = struct.unpack_from("iIII", data, i)
                name = data[i + 16 : i + 16 + size].rstrip(b"\0").decode()
                out.append((mask, name))
                i += 16 + size

    def outside_paths(self, outside: Path) -> list:
        real = outside.resolve()
        return [(e, p) for e, p in self.seen
                if Path(p).resolve() == real or Path(p).resolve().is_relative_to(real)]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


# ---- the root -----------------------------------------------------------------------------------


def _png(path: Path, value: int) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8), value, dtype=np.uint8)).save(path)


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _sharded(folder: Path, model: Path, second: str) -> None:
    """`model`'s config, and its tensors split in two: the first shard in `folder`, the
    second at `second` (relative to `folder`, or absolute) as the index names it."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True)
    shutil.copy(model / "config.json", folder / "config.json")
    state = load_file(str(model / "model.safetensors"))
    names = sorted(state)
    half = len(names) // 2
    save_file({k: state[k] for k in names[:half]}, str(folder / "model-00001.safetensors"))
    target = Path(second) if Path(second).is_absolute() else folder / second
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: state[k] for k in names[half:]}, str(target))
    index = {"metadata": {}, "weight_map": {**{k: "model-00001.safetensors" for k in names[:half]},
                                            **{k: second for k in names[half:]}}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(root, outside): the root the app is confined to, and the folder its links lead to."""
    import datasets

    base = tmp_path_factory.mktemp("roots")
    root, out = base / "root", base / "outside"
    root.mkdir()
    out.mkdir()
    good = [save_random("vit", root / f"good-{s}", seed=s, **VIT) for s in (0, 1)]
    # models: an index that climbs out, one that names an absolute path, a linked shard in a
    # subfolder, a linked image processor file
    _sharded(root / "trav-rel", good[0], "../../outside/rel.safetensors")
    _sharded(root / "trav-abs", good[0], str(out / "abs.safetensors"))
    _sharded(root / "sublink", good[0], "sub/x.safetensors")
    (out / "x.safetensors").write_bytes((root / "sublink" / "sub" / "x.safetensors").read_bytes())
    (root / "sublink" / "sub" / "x.safetensors").unlink()
    (root / "sublink" / "sub" / "x.safetensors").symlink_to(out / "x.safetensors")
    shutil.copytree(good[0], root / "proclink")
    (out / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "x"}))
    (root / "proclink" / "preprocessor_config.json").symlink_to(out / "preprocessor_config.json")
    # data: linked files, a linked class folder, datasets and parquet folders with linked files
    (root / "data").mkdir()
    (root / "data" / "ok.txt").write_text("the text under the root " * 20)
    (out / "leak.txt").write_text("a secret outside the root " * 20)
    (out / "leak.csv").write_text("text,label\n" + "secret,logging\n" * 30)
    for name in ("leak.txt", "leak.csv"):
        (root / "data" / name).symlink_to(out / name)
    for c, v in (("a", 0), ("b", 200)):
        for i in range(5):
            _png(root / "imgs-ok" / c / f"{i}.png", v + i)
            if c == "a":
                _png(root / "imgs" / c / f"{i}.png", v + i)
            else:
                _png(out / "b" / f"{i}.png", v + i)
    (root / "imgs" / "b").symlink_to(out / "b")
    _parquet(root / "pq-ok" / "rows.parquet", ROWS)  # one unnamed split: seeded tenths
    _parquet(out / "train.parquet", ROWS)
    (root / "pq").mkdir()
    (root / "pq" / "train.parquet").symlink_to(out / "train.parquet")
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(ROWS).save_to_disk(str(out / "ds"))
    (root / "hfds").mkdir()
    for f in (out / "ds").iterdir():
        if f.suffix == ".arrow":
            (root / "hfds" / f.name).symlink_to(f)
        else:
            shutil.copy(f, root / "hfds" / f.name)
    return root, out


def _one_line(e: pytest.ExceptionInfo, *fragments: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg


def test_the_app_lists_refuses_and_never_opens_what_lies_outside(setup, monkeypatch):
    root, out = setup
    monkeypatch.setenv(app_roots.ENV_ROOTS, str(root))
    roots = [root.resolve()]
    outside_folders = [out, out / "b", out / "ds"]
    watcher = Watcher(outside_folders)
    watcher.native_events()  # drained: only what happens from here on counts
    bad_models = {
        "trav-rel": "shard '../../outside/rel.safetensors' named in "
                    f"'{root / 'trav-rel'}' is not a plain relative name inside the folder",
        "trav-abs": f"shard '{out / 'abs.safetensors'}' named in '{root / 'trav-abs'}' is not "
                    "a plain relative name inside the folder",
        "sublink": f"model folder entry '{root / 'sublink' / 'sub' / 'x.safetensors'}' leads "
                   f"to '{out / 'x.safetensors'}', outside the model roots",
        "proclink": f"model folder entry '{root / 'proclink' / 'preprocessor_config.json'}' "
                    f"leads to '{out / 'preprocessor_config.json'}', outside the model roots",
    }
    bad_data = {
        f"text:{root / 'data' / 'leak.txt'}": f"'{root / 'data' / 'leak.txt'}' is outside the "
                                              "roots",
        f"csv:{root / 'data' / 'leak.csv'}": f"'{root / 'data' / 'leak.csv'}' is outside the "
                                             "roots",
        f"imagefolder:{root / 'imgs'}": f"class folder '{root / 'imgs' / 'b'}' leads to "
                                        f"'{out / 'b'}', outside the roots",
        f"hf:{root / 'pq'}": f"hf: folder entry '{root / 'pq' / 'train.parquet'}' leads to "
                             f"'{out / 'train.parquet'}', outside the roots",
        f"hf:{root / 'hfds'}": f"hf: folder entry '{root / 'hfds'}/data-00000-of-00001.arrow' "
                               f"leads to '{out / 'ds'}/data-00000-of-00001.arrow', outside",
    }
    res = app.Resources()
    with watcher:
        # what the sidebar offers: the good ones only
        assert app_roots.discover([root]) == [str(root / "good-0"), str(root / "good-1")]
        assert app_roots.discover_data([root]) == [
            f"hf:{root / 'pq-ok'}", f"imagefolder:{root / 'imgs-ok'}",
            f"text:{root / 'data' / 'ok.txt'}"]
        # what is typed (or comes in the URL): refused in one line
        for name, expected in bad_models.items():
            with pytest.raises(RotvizError) as e:
                app_roots.resolve_choice(str(root / name), roots)
            _one_line(e, expected)
            for kind in ("card", "match"):  # the pages' computations, through Resources
                cfg = {"ref": str(root / name), "anchor": str(root / "good-0"),
                       "source": str(root / name), "spec": "seed", "layers": "",
                       "device": "cpu", "data": "digits", "seed": 0, "n_eval": 20}
                with pytest.raises(RotvizError) as e:
                    app.run(kind, res, cfg)
                _one_line(e, expected.replace("the roots", "the model roots"))
        for ref, expected in bad_data.items():
            with pytest.raises(RotvizError) as e:
                app_roots.resolve_data(ref, roots)
            _one_line(e, expected)
        # data picked or named in the URL that skips resolve_data: the split refuses it too
        vit, cls = str(root / "good-0"), "zoo:roberta-topics-a"
        for ref, model in ((f"text:{root / 'data' / 'leak.txt'}", vit),
                           (f"imagefolder:{root / 'imgs'}", vit),
                           (f"csv:{root / 'data' / 'leak.csv'}", cls),
                           (f"hf:{root / 'pq'}", cls), (f"hf:{root / 'hfds'}", cls)):
            with pytest.raises(RotvizError) as e:
                res.split(ref, 0, 0, model)
            _one_line(e, "outside the model roots")
        # data that activation matching learns from is read through the app's roots too
        leak = f"text:{root / 'data' / 'leak.txt'}"
        cfg = {"anchor": vit, "source": str(root / "good-1"), "spec": "weight,act",
               "layers": "", "device": "cpu", "data": leak, "seed": 0, "n_eval": 20}
        with pytest.raises(RotvizError) as e:
            app.run("match", res, cfg)
        _one_line(e, f"data file '{root / 'data' / 'leak.txt'}' leads to '{out / 'leak.txt'}', "
                     "outside the model roots")
        # and the good ones work, with the watcher on
        card = app.run("card", res, {"ref": vit, "data": "digits", "seed": 0, "n_eval": 20})
        assert card["n_eval"] == 20 and card["check"]["passed"]
        assert res.split(f"imagefolder:{root / 'imgs-ok'}", 0, 0, vit).n == 1
        assert res.split(f"hf:{root / 'pq-ok'}", 0, 0, cls).n == 3
    assert watcher.outside_paths(out) == []
    assert watcher.native_events() == []
    # the watcher sees reads: of the root's files above, and of an outside file now
    assert any(p == str(root / "good-0" / "config.json") for _, p in watcher.seen)
    with watcher:
        (out / "leak.txt").read_bytes()
    assert watcher.outside_paths(out) == [("open", str(out / "leak.txt"))]
    assert watcher.fd < 0 or any(name == "leak.txt" and mask & IN_OPEN
                                 for mask, name in watcher.native_events())
    watcher.close()


def test_the_pages_offer_and_show_nothing_from_outside(setup, monkeypatch):
    """The same root through the pages (streamlit.testing AppTest): the sidebar offers only
    the good models and data, a typed folder or data that reaches out is the page's one-line
    error, and a data reference in the URL that the sidebar does not offer is not read."""
    from test_app import app, texts

    root, out = setup
    monkeypatch.setenv(app_roots.ENV_ROOTS, str(root))
    watcher = Watcher([out, out / "b", out / "ds"])
    watcher.native_events()
    pair = {"anchor_path": str(root / "good-0"), "source_path": str(root / "good-1")}
    with watcher:
        at = app("models", **pair, data=f"text:{root / 'data' / 'leak.txt'}")
        offered = [str(o) for o in at.selectbox(key="anchor").options]
        assert not any(bad in o for o in offered for bad in ("trav", "sublink", "proclink"))
        assert any(o.endswith("good-1") for o in offered)
        data = [str(o) for o in at.selectbox(key="data").options]
        assert [d for d in data if str(root) in d] == [
            f"hf:{root / 'pq-ok'}", f"imagefolder:{root / 'imgs-ok'}",
            f"text:{root / 'data' / 'ok.txt'}"]
        assert at.selectbox(key="data").value == "auto" and "leak" not in texts(at)
        at = app("models", **pair, data_path=f"imagefolder:{root / 'imgs'}")
        assert f"class folder '{root / 'imgs' / 'b'}' leads to '{out / 'b'}'" in texts(at)
        at = app("models", anchor_path=str(root / "good-0"),
                 source_path=str(root / "sublink"))
        assert (f"model folder entry '{root / 'sublink' / 'sub' / 'x.safetensors'}' leads to "
                f"'{out / 'x.safetensors'}', outside the model roots") in texts(at)
    assert watcher.outside_paths(out) == [] and watcher.native_events() == []
    watcher.close()
