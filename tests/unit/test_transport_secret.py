"""The job's secret file (PSNODE_KEY_FILE): format, modes, permissions, and errors that name
the file and the fix."""
from __future__ import annotations

import os

import pytest

from psnode.errors import ConfigError
from psnode.net.security import TOKEN_BYTES, Mechanism, Mode, Plane, Security, mechanism, parse
from psnode.net.transport import new_security

PUB = b"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
SEC = b"JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"


def test_round_trip_per_mode_and_the_file_is_0600(tmp_path) -> None:
    for mode in (Mode.AUTHENTICATED, Mode.ENCRYPTED):
        path = tmp_path / f"{mode.value}.key"
        sec = new_security(mode)
        sec.save(str(path))
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert Security.load(str(path)) == sec
        text = path.read_text()
        assert f"\nmode {mode.value}\n" in text and sec.token.hex() in text
        assert len(sec.token) == TOKEN_BYTES and len(sec.curve_public) == 40 and len(sec.curve_secret) == 40
    a, b = new_security(Mode.AUTHENTICATED), new_security(Mode.AUTHENTICATED)
    assert a.token != b.token and a.curve_secret != b.curve_secret      # fresh per job


def test_no_file_is_insecure_and_insecure_has_no_file(tmp_path) -> None:
    assert Security.load(None) == Security.load("") == Security.insecure()
    assert new_security(Mode.INSECURE) == Security.insecure()
    with pytest.raises(ValueError, match="leave PSNODE_KEY_FILE unset"):
        Security.insecure().save(str(tmp_path / "x"))
    with pytest.raises(ValueError):
        Security(Mode.INSECURE, token=bytes(32))


def test_save_narrows_an_existing_wider_file(tmp_path) -> None:
    path = tmp_path / "job.key"
    path.write_text("old")
    os.chmod(path, 0o644)
    new_security(Mode.AUTHENTICATED).save(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o602])
def test_a_file_others_can_use_is_refused_naming_the_fix(tmp_path, mode) -> None:
    path = tmp_path / "job.key"
    new_security(Mode.AUTHENTICATED).save(str(path))
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as exc:
        Security.load(str(path))
    assert str(path) in str(exc.value) and f"chmod 600 {path}" in str(exc.value)
    assert f"{mode:04o}" in str(exc.value)


def test_a_file_of_another_user_is_refused(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    path = tmp_path / "job.key"
    new_security(Mode.AUTHENTICATED).save(str(path))
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        Security.load(str(path))


def test_missing_file_symlink_and_directory_are_refused(tmp_path) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(ConfigError) as exc:
        Security.load(str(missing))
    assert str(missing) in str(exc.value) and "PSNODE_KEY_FILE" in str(exc.value)
    assert "mxdist launch writes a fresh one" in str(exc.value)
    real = tmp_path / "real.key"
    new_security(Mode.AUTHENTICATED).save(str(real))
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="cannot read"):
        Security.load(str(link))          # O_NOFOLLOW: a link could point anywhere
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        Security.load(str(tmp_path / "dir"))


def _good(mode: str = "authenticated") -> list[str]:
    return ["psnode-secret 1", f"mode {mode}", "token " + "ab" * 32, f"curve-public {PUB.decode()}",
            f"curve-secret {SEC.decode()}"]


@pytest.mark.parametrize(("lines", "message"), [
    ([], "does not start with 'psnode-secret 1'"),
    (["psnode-secret 2", *_good()[1:]], "does not start with 'psnode-secret 1'"),
    (_good()[:-1], "lacks curve-secret"),
    ([*_good(), "token " + "cd" * 32], "line 6: token appears twice"),
    ([*_good(), "colour blue"], "line 6: expected one of mode, token, curve-public, curve-secret"),
    (_good("insecure"), "mode 'insecure': expected authenticated or encrypted (for no security at all, "
                        "leave PSNODE_KEY_FILE unset)"),
    (_good("fast"), "mode 'fast'"),
    ([*_good()[:2], "token xyz", *_good()[3:]], "token that is not hexadecimal"),
    ([*_good()[:2], "token abcd", *_good()[3:]], "token of 2 bytes, not 32"),
    ([*_good()[:3], "curve-public tooshort", *_good()[4:]], "bad key: curve_public"),
])
def test_bad_content_names_the_file_and_line(lines, message) -> None:
    with pytest.raises(ConfigError) as exc:
        parse("\n".join(lines).encode(), "/run/job.key")
    assert "/run/job.key" in str(exc.value) and message in str(exc.value)


def test_comments_blank_lines_and_binary(tmp_path) -> None:
    sec = parse("\n# hello\n\n".join(_good()).encode())
    assert sec.mode is Mode.AUTHENTICATED and sec.token == bytes.fromhex("ab" * 32)
    with pytest.raises(ConfigError, match="not ASCII"):
        parse(b"\xff\xfe", "/k")
    big = tmp_path / "big.key"
    big.write_bytes(b"#" * 5000)
    os.chmod(big, 0o600)
    with pytest.raises(ConfigError, match="larger than 4096 bytes"):
        Security.load(str(big))


def test_the_older_two_line_curve_file_reads_as_encrypted(tmp_path) -> None:
    """What an older mxdist wrote (nothing writes it now): a job it started can still be reached."""
    path = tmp_path / "job.key"
    keys = new_security(Mode.ENCRYPTED)
    path.write_bytes(keys.curve_public + b"\n" + keys.curve_secret + b"\n")
    path.chmod(0o600)
    sec = Security.load(str(path))
    assert sec.mode is Mode.ENCRYPTED
    assert (sec.curve_public, sec.curve_secret) == (keys.curve_public, keys.curve_secret)
    assert sec.token == Security.load(str(path)).token and len(sec.token) == 32   # derived, stable


def test_secrets_stay_out_of_repr_and_proofs_are_keyed() -> None:
    sec = new_security(Mode.AUTHENTICATED)
    assert sec.token.hex() not in repr(sec) and sec.curve_secret.decode() not in repr(sec)
    other = new_security(Mode.AUTHENTICATED)
    assert sec.verify(b"x", sec.proof(b"x")) and not sec.verify(b"x", other.proof(b"x"))
    assert not sec.verify(b"y", sec.proof(b"x"))
    assert sec.client_password("h:1") != sec.client_password("h:2") != sec.server_proof("h:2")
    assert Security.insecure().proof(b"x") == b"" and Security.insecure().verify(b"x", b"junk")


def test_mechanism_per_mode_and_plane() -> None:
    assert {p: mechanism(Mode.INSECURE, p) for p in Plane} == dict.fromkeys(Plane, Mechanism.NULL)
    assert {p: mechanism(Mode.ENCRYPTED, p) for p in Plane} == dict.fromkeys(Plane, Mechanism.CURVE)
    assert mechanism(Mode.AUTHENTICATED, Plane.CONTROL) is Mechanism.CURVE
    assert mechanism(Mode.AUTHENTICATED, Plane.DATA) is Mechanism.PLAIN
