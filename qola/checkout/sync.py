"""Bring a kernel tree to a pinned commit with a patch set applied (QoLA's checkout, with qola's
guarantees):

- an absent (or empty) tree is cloned into a temporary directory beside it and renamed into place
  only when everything succeeded;
- the commit is resolved locally, else fetched from ``origin``; after the checkout HEAD is verified
  to be exactly that commit (a short sha must be its prefix);
- HEAD is detached (a branch of the user's is never moved); submodules are synced and updated;
- a tree with changes qola did not make is refused unless ``force``, or unless it is qola's own
  checkout dir (``own``: the default one, where another builder such as QoLA applied its patches): there
  they are discarded and the notes list them;
- the patches (``*.patch`` of the patches dir, lexical order) apply all-or-nothing: when one does
  not apply, the ones before it are reversed and the tree is put back as it was before the call
  (commit, submodules, the previous patch set), and the error names the patch and the hunk;
- a tree already at the commit with the same patch set and untouched since is left alone (no file
  is rewritten: incremental builds stay incremental).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.checkout import git
from qola.checkout.state import Snapshot, clear_stamp, read_stamp, snapshot, write_stamp
from qola.core import inputs, lock
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write, inside, replace_dir
from qola.core.secret import Secret, basic_authorization

HEX = re.compile(r"[0-9a-f]{4,40}\Z")
LOCK_WAIT = 3600.0  # seconds another checkout of the same tree may take


@dataclass(frozen=True)
class Request:
    root: Path
    commit: str | None  # a sha, tag or branch (None: the tree's HEAD; the tree must exist)
    commit_from: str  # where the commit came from, for messages ("--aiter-commit", "[qola] aiter_commit")
    patches: tuple[Path, ...] = ()
    url: str = ""  # never with credentials in it: those are in ``credentials`` (qola.core.secret.split_url)
    force: bool = False
    own: bool = False  # qola's own checkout dir: changes another builder left are discarded, and said
    env: Mapping[str, str] = field(default_factory=dict, compare=False)
    credentials: Secret | None = field(default=None, compare=False)

    def network_env(self) -> Mapping[str, str]:
        """``env`` for a step that reaches ``url``: the credentials, if any, as an Authorization header
        for that URL's host only, in git's environment-only config (never in argv, .git/config or a log)."""
        if not self.credentials:
            return self.env
        import urllib.parse  # lazy: paid only by the callers that need it

        parts = urllib.parse.urlsplit(self.url)
        n = int(self.env.get("GIT_CONFIG_COUNT", "0") or 0)
        return {
            **self.env,
            "GIT_CONFIG_COUNT": str(n + 1),
            f"GIT_CONFIG_KEY_{n}": f"http.{parts.scheme}://{parts.netloc}/.extraHeader",
            f"GIT_CONFIG_VALUE_{n}": "Authorization: " + basic_authorization(self.credentials),
        }


@dataclass
class Result:
    root: Path
    commit: str
    patches: tuple[str, ...]
    changed: bool  # False: the tree already was this checkout; nothing was touched
    cloned: bool = False
    notes: list[str] = field(default_factory=list)


MAX_PATCH = 64 << 20  # one patch file


def collect_patches(patches_dir: Path | None, where: str) -> tuple[Path, ...]:
    """The ``*.patch`` files of ``patches_dir`` in lexical order. ``/dev/null`` or an empty dir: none;
    a dir that does not exist is an error (a typo must not silently skip the patches), and so is a
    ``*.patch`` that is not a regular file (a dangling link, a FIFO, a directory): a symbolic link to
    a regular file is followed."""
    if patches_dir is None or str(patches_dir) == os.devnull:
        return ()
    if not patches_dir.is_dir():
        raise QolaError(
            f"{where}: patches dir {patches_dir} does not exist or is not a directory",
            hint="fix the path, or give an empty directory (or /dev/null) to apply no patches",
        )
    found = sorted((p for p in patches_dir.iterdir() if p.name.endswith(".patch")), key=lambda p: p.name)
    for p in found:
        hint = "remove it, or make it the patch file it should be"
        try:
            inputs.check_type(p, want="file", what=f"{where}: patch", follow=True, limit=MAX_PATCH, hint=hint)
        except FileNotFoundError:
            raise QolaError(f"{where}: patch {p} is a symbolic link to nothing ({os.readlink(p)})", hint=hint) from None
    return tuple(found)


def read_patch(path: Path) -> bytes:
    """A patch's bytes, through the one checked open (a regular file of at most :data:`MAX_PATCH`)."""
    try:
        return inputs.read_checked(path, limit=MAX_PATCH, what="patch")
    except FileNotFoundError:
        raise QolaError(f"patch {path} is gone (or a symbolic link to nothing)") from None


def _digest(commit: str, patches: Sequence[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(commit.encode())
    for name, data in patches:
        h.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def ensure(req: Request) -> Result:
    """Bring ``req.root`` to the request (see the module's docstring). One checkout per tree at a
    time: a lock file beside the tree (``.<name>.qola-checkout.lock``) queues the others."""
    root = Path(os.path.abspath(req.root))
    if root.is_symlink():  # a tree kept elsewhere (another disk): the link is followed, never replaced
        if not root.is_dir():
            raise QolaError(
                f"--aiter-root {root} is a symbolic link to {os.readlink(root)}, which is not a directory",
                hint="point the link at a directory (an empty one to clone into), or pass that directory",
            )
        root = Path(os.path.realpath(root))
    parent = root.parent
    if not root.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise QolaError(
                f"cannot create {parent} for the checkout: {exc.strerror or exc}",
                hint="pass --aiter-root with a directory you can write",
            ) from None
    if not os.access(parent, os.W_OK | os.X_OK):
        return _ensure(req, root)  # nowhere to put a lock (and nowhere to clone): checked on the way
    guard = {parent / f".{root.name}.qola-checkout.lock": f"the kernel tree {root}"}
    with lock.acquire(guard, ["qola", "checkout", str(root)], wait=LOCK_WAIT):
        return _ensure(req, root)


def _ensure(req: Request, root: Path) -> Result:
    fresh = not root.exists() or (root.is_dir() and not any(root.iterdir()))
    if fresh:
        return _clone_and_checkout(req, root)
    if not root.is_dir() or not (root / ".git").exists():
        raise QolaError(
            f"{root} exists and is not a git checkout: qola clones only into an absent or empty "
            "directory and never replaces one it did not make",
            hint="pass --aiter-root with another directory, or build this tree as it is with --skip-checkout",
        )
    return _checkout(req, root, cloned=False)


def _clone_and_checkout(req: Request, root: Path) -> Result:
    if req.commit is None:
        raise QolaError(
            f"there is no checkout at {root} and no commit to clone",
            hint="set [qola] aiter_commit in the manifest or pass --aiter-commit",
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.qola-clone-", dir=root.parent))
    try:
        git.run(
            None,
            "clone",
            "--no-checkout",
            "--filter=blob:none",
            "--",
            req.url,
            str(tmp),
            env=req.network_env(),
            network=req.url,
        )
        result = _checkout(req, tmp, cloned=True)
        replace_dir(tmp, root)  # in place of the empty dir we were given, if any
    except QolaError as exc:  # name the directory the user gave, not the temporary clone
        shutil.rmtree(tmp, ignore_errors=True)
        exc.message = exc.message.replace(str(tmp), str(root)) + f"\n  (nothing was left at {root})"
        exc.hint = exc.hint.replace(str(tmp), str(root)) if exc.hint else exc.hint
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.root = root
    result.notes = [n.replace(str(tmp), str(root)) for n in result.notes]  # the temporary clone is gone
    result.notes.insert(0, f"cloned {req.url} into {root}")
    return result


def _resolve(req: Request, root: Path) -> str:
    if req.commit is None:
        return git.out(root, "rev-parse", "HEAD", env=req.env)
    spec = f"{req.commit}^{{commit}}"
    if not git.ok(root, "rev-parse", "--verify", "--quiet", spec, env=req.env):
        _refuse_ambiguous(req, root)
        url = git.run(root, "remote", "get-url", "origin", env=req.env, check=False).stdout.strip() or "origin"
        try:
            git.run(root, "fetch", "--quiet", "origin", req.commit, env=_net(req, url), network=url)
        except git.GitError as first:
            try:  # servers that refuse fetching a sha by name: fetch everything
                git.run(root, "fetch", "--quiet", "--tags", "origin", env=_net(req, url), network=url)
            except git.GitError as second:
                raise QolaError(
                    f"commit {req.commit!r} ({req.commit_from}) is not in {root} and fetching it from "
                    f"{url} failed:\n  {first.message}\n  then {second.message}",
                    hint=second.hint,
                ) from None
        if not git.ok(root, "rev-parse", "--verify", "--quiet", spec, env=req.env):
            raise QolaError(
                f"commit {req.commit!r} ({req.commit_from}) is not in {root}, even after fetching from {url}",
                hint="check the commit (a sha, tag or branch of that repository)",
            )
    sha = git.out(root, "rev-parse", "--verify", spec, env=req.env)
    if HEX.match(req.commit.lower()) and not sha.startswith(req.commit.lower()):
        raise QolaError(
            f"{req.commit!r} ({req.commit_from}) resolves to {sha} in {root}, not to a commit "
            "starting with it (a branch or tag of that name?)",
            hint="pin the full 40-digit sha",
        )
    return sha


def _net(req: Request, url: str) -> Mapping[str, str]:
    """The environment of a step that reaches ``url``: the request's credentials only for its URL."""
    return req.network_env() if url == req.url else req.env


def _refuse_ambiguous(req: Request, root: Path) -> None:
    """A short sha naming several commits here is ambiguous: said so (fetching cannot help)."""
    commit = (req.commit or "").lower()
    if not HEX.match(commit) or len(commit) == 40:
        return
    res = git.run(root, "rev-parse", f"--disambiguate={commit}", env=req.env, check=False)
    names = [n for n in res.stdout.split() if HEX.match(n)]
    if len(names) < 2:
        return
    kinds = {n: git.run(root, "cat-file", "-t", n, env=req.env, check=False).stdout.strip() for n in names[:32]}
    commits = [n for n, k in kinds.items() if k in ("commit", "tag")]
    if len(commits) > 1:
        shown = ", ".join(c[:12] for c in commits[:6]) + (f" and {len(commits) - 6} more" if len(commits) > 6 else "")
        raise QolaError(
            f"{req.commit!r} ({req.commit_from}) is ambiguous in {root}: {len(commits)} commits start with it ({shown})",
            hint="pin more digits (the full 40-digit sha is best)",
        )


def _checkout(req: Request, root: Path, *, cloned: bool) -> Result:
    env = req.env
    target = _resolve(req, root)
    patches = [(p.name, read_patch(p)) for p in req.patches]
    key = _digest(target, patches)
    before = snapshot(root, env)
    found = read_stamp(root, env)
    stamp = found or {}  # {}: no stamp (then not ours)
    ours = found is not None and stamp.get("state") == before.digest and stamp.get("commit") == before.head
    if ours and stamp.get("key") == key and before.head == target:
        return Result(
            root,
            target,
            tuple(n for n, _ in patches),
            changed=False,
            notes=[f"{root} is already at {target[:12]} with this patch set; nothing to do"],
        )
    shown = _shown_changes(before)
    discarded = not before.pristine and not ours and not cloned  # a fresh clone has no files yet
    if discarded and not req.force and not req.own:
        raise QolaError(
            f"{root} has changes qola did not make; refusing to reset it:\n    {shown}",
            hint="commit or stash them, build the tree as it is with --skip-checkout, or discard "
            "them: qola checkout --force, qola build --force-checkout (or QOLA_FORCE_AITER_CHECKOUT=1)",
        )
    kept = _keep_discarded(root, before, env) if discarded else []
    branch = git.run(root, "symbolic-ref", "--quiet", "--short", "HEAD", env=env, check=False).stdout.strip()
    previous = [(p["name"], p["text"].encode()) for p in stamp.get("patches", [])] if ours else []
    _move(root, target, stamp.get("added", []) if ours else [], env)
    try:
        added = _apply(root, req.patches, patches, env)
    except _PatchFailed as failed:
        if not cloned:
            _restore(root, branch or before.head, previous, before, env, failed)
        raise QolaError(failed.message, hint=failed.hint) from None
    after = snapshot(root, env)
    if after.head != target:
        raise QolaError(f"{root} is at {after.head} after checking out {target}: the pin could not be verified")
    write_stamp(
        root,
        env,
        {
            "commit": target,
            "key": key,
            "state": after.digest,
            "added": added,
            "patches": [
                {"name": n, "sha256": hashlib.sha256(d).hexdigest(), "text": d.decode("utf-8", "surrogateescape")}
                for n, d in patches
            ],
        },
    )
    notes = [_discarded_note(req, root, shown, kept)] if discarded else []
    notes += [
        f"checked out {target[:12]} ({req.commit or 'HEAD'}) in {root}"
        + (f" (was {before.head[:12]}{' on branch ' + branch if branch else ''})" if before.head != target else "")
    ]
    if patches:
        notes.append(f"applied {len(patches)} patch(es): {', '.join(n for n, _ in patches)}")
    return Result(root, target, tuple(n for n, _ in patches), changed=True, cloned=cloned, notes=notes)


def _shown_changes(before: Snapshot) -> str:
    more = len(before.changes) - 12
    return "\n    ".join(before.changes[:12]) + (f"\n    (+{more} more)" if more > 0 else "")


def _discarded_note(req: Request, root: Path, shown: str, kept: Sequence[str]) -> str:
    where = "its own checkout dir " if req.own and not req.force else ""
    back = f"\n  kept as git stashes (git stash list, git stash apply): {', '.join(kept)}" if kept else ""
    return (
        f"discarded changes qola did not make in {where}{root} (another builder's patches, e.g. QoLA's):"
        f"\n    {shown}{back}"
    )


STASH_ID = {  # who the stashes are by where git has no identity of its own (the environment's wins)
    "GIT_AUTHOR_NAME": "qola",
    "GIT_AUTHOR_EMAIL": "qola@localhost",
    "GIT_COMMITTER_NAME": "qola",
    "GIT_COMMITTER_EMAIL": "qola@localhost",
}


def _keep_discarded(root: Path, before: Snapshot, env: Mapping[str, str]) -> list[str]:
    """The tracked changes about to be discarded, kept as a stash of the tree and of each submodule
    (``git stash create`` then ``store``: the working tree untouched, nothing lost); their names. A
    change that cannot be kept is not discarded: the checkout stops, naming it."""
    ident = {**STASH_ID, **env}
    kept = []
    for where in ["", *before.submodules]:
        base = root / where if where else root
        made = git.run(base, "stash", "create", env=ident, check=False)
        sha = made.stdout.strip()
        stored = (
            git.run(base, "stash", "store", "-m", "qola checkout: discarded", sha, env=ident, check=False)
            if sha
            else None
        )
        if made.returncode != 0 or (stored is not None and stored.returncode != 0):
            raise QolaError(
                f"{root} has changes qola did not make, and keeping them ({where or 'the tree'}) failed; not resetting it:"
                f"\n    {(made.stderr or (stored.stderr if stored else '')).strip()}",
                hint="commit or stash them yourself, or discard them: qola checkout --force",
            )
        if sha:
            kept.append(f"{where or '.'} {sha[:12]}")
    return kept


def _move(root: Path, target: str, added: Sequence[str], env: Mapping[str, str]) -> None:
    """Detach HEAD at ``target`` (local changes discarded: the caller checked they may be) and update
    the submodules. ``added``: files a previous patch set created (removed first: untracked files
    survive a checkout)."""
    for rel in added:
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            continue
        try:  # its directory must stay in the tree (never through a link out of it)
            parent = inside(root, str(Path(rel).parent)) if Path(rel).parent != Path(".") else root
            path = parent / Path(rel).name
            st = os.lstat(path)
        except (OSError, QolaError):
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):  # a link (to a dir, dangling): the link
            path.unlink()
    git.run(root, "checkout", "--quiet", "--force", "--detach", target, env=env)
    if (root / ".gitmodules").exists():
        url = git.run(root, "remote", "get-url", "origin", env=env, check=False).stdout.strip() or "origin"
        git.run(root, "submodule", "sync", "--quiet", "--recursive", env=env)
        git.run(root, "submodule", "update", "--init", "--recursive", "--force", "--quiet", env=env, network=url)


class _PatchFailed(Exception):
    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


def _untracked(root: Path, env: Mapping[str, str]) -> set[str]:
    out = git.run(root, "ls-files", "-z", "--others", "--exclude-standard", env=env).stdout
    return {p for p in out.split("\0") if p}


def _apply(
    root: Path, files: Sequence[Path], patches: Sequence[tuple[str, bytes]], env: Mapping[str, str]
) -> list[str]:
    """Apply every patch (each one atomically: ``git apply`` writes all its hunks or none); when one
    fails, reverse the ones applied and raise :class:`_PatchFailed`. Returns the files they added."""
    before = _untracked(root, env)
    done: list[Path] = []
    for path, (_name, data) in zip(files, patches):
        res = git.run(root, "apply", "--whitespace=nowarn", str(path.resolve()), env=env, check=False)
        if res.returncode != 0:
            undone = _reverse(root, done, env)
            where = _hunk(data, res.stderr)
            raise _PatchFailed(
                f"patch {path} does not apply to {root}{where}:\n    "
                + res.stderr.strip().replace("\n", "\n    ")
                + (f"\n  {len(done)} patch(es) applied before it were reversed" if done and undone else ""),
                hint="rebase the patch on the pinned commit, or pin the commit it was made for; the tree is as "
                "it was before this checkout",
            )
        done.append(path)
    return sorted(_untracked(root, env) - before)


def _reverse(root: Path, applied: Sequence[Path], env: Mapping[str, str]) -> bool:
    for path in reversed(applied):
        if (
            git.run(
                root, "apply", "--reverse", "--whitespace=nowarn", str(path.resolve()), env=env, check=False
            ).returncode
            != 0
        ):
            return False
    return True


_FAILED_AT = re.compile(r"patch failed: (.+):(\d+)")


def _hunk(patch: bytes, stderr: str) -> str:
    """`` (hunk "@@ -12,7 +12,8 @@" of path)`` for git's "patch failed: path:12", else ''."""
    m = _FAILED_AT.search(stderr)
    if not m:
        return ""
    path, line = m.group(1), m.group(2)
    current = None
    for raw in patch.decode("utf-8", "replace").splitlines():
        if raw.startswith("--- "):
            current = raw[4:].split("\t")[0].removeprefix("a/")
        elif raw.startswith("@@ -") and current == path and raw[4:].split(",")[0].split(" ")[0] == line:
            return f" (hunk {raw.split('@@')[1].strip()!r} of {path})"
    return f" (the hunk at line {line} of {path})"


def _restore(
    root: Path,
    where: str,
    previous: Sequence[tuple[str, bytes]],
    before: Snapshot,
    env: Mapping[str, str],
    failed: _PatchFailed,
) -> None:
    """Put the tree back as :func:`_checkout` found it: its branch or commit, its submodules and (when
    it held qola's previous patch set) those patches. Says so in ``failed`` when it could not."""
    try:
        added = sorted(_untracked(root, env) - set(before.untracked))
        _move(root, before.head, added, env)
        if where != before.head:
            git.run(root, "checkout", "--quiet", where, env=env)
        tmp = Path(tempfile.mkdtemp(prefix="qola-patches-"))
        try:
            files = []
            for i, (name, data) in enumerate(previous):
                files.append(tmp / f"{i:04d}-{os.path.basename(name)}")
                atomic_write(files[-1], data)
            _apply(root, files, previous, env)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        same = snapshot(root, env).digest == before.digest
    except (QolaError, _PatchFailed, OSError) as exc:
        same, failed.message = False, failed.message + f"\n  restoring the tree failed: {exc}"
    if not same:
        clear_stamp(root, env)
        failed.hint = (
            f"the tree could not be put back exactly as it was (HEAD {before.head[:12]}); check it "
            "with git status, then rerun with --force"
        )
