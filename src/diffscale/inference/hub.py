"""Publishing an exported folder on the Hugging Face Hub (``diffscale export --push-to-hub``)
through huggingface_hub: the repo id checked by its own validator and the token found where
its other tools look (``HF_TOKEN``, the token ``hf auth login`` stored) before anything is
written; then ``HfApi.create_repo`` and ``upload_folder``. ``HF_ENDPOINT`` points it at another
Hub (a mirror, or a stand-in in tests)."""

from __future__ import annotations

import re
from pathlib import Path

from diffscale.errors import UserError

LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*")
"""The shape of the Hub's licence identifiers (``mit``, ``apache-2.0``, ``cc-by-nc-4.0``, ``openrail++``)."""
_LOGIN = "set HF_TOKEN, run `hf auth login`, or pass --token-file FILE (a token with write access)"


def check_license(license_id: str | None) -> str | None:
    if license_id is not None and not LICENSE_ID.fullmatch(license_id):
        raise UserError(f"--license '{license_id}' is not a licence identifier of the Hub",
                        "pass one in lower case, e.g. --license mit, apache-2.0 or cc-by-4.0 (other: --license other)")
    return license_id


def check_repo_id(repo: str) -> str:
    """``repo`` as huggingface_hub's validator accepts it (``NAME`` or ``OWNER/NAME``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise UserError(f"--push-to-hub '{repo}' is not a Hub repo id ({str(exc).rstrip('.')})",
                        "write OWNER/NAME of letters, digits, '-', '_' and '.', e.g. --push-to-hub my-lab/glyphs-ddpm"
                        ) from exc
    return repo


def find_token(token_file: str | Path | None) -> str:
    """The token of ``token_file``, else the one huggingface_hub finds (HF_TOKEN, the stored login)."""
    from huggingface_hub import get_token

    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise UserError(f"--token-file '{path}' cannot be read ({exc.strerror or exc})",
                            "pass a file that holds the Hub token") from exc
        except UnicodeDecodeError as exc:
            raise UserError(f"--token-file '{path}' is not text (byte {exc.start} is {exc.object[exc.start]:#04x}; a "
                            "Hub token is plain ASCII)", "write the token alone into the file, as text") from exc
        if not token:
            raise UserError(f"--token-file '{path}' is empty", "write the Hub token into it")
        return token
    found = get_token()
    if not found:
        raise UserError("pushing to the Hub needs a token and none was found", _LOGIN)
    return found


def push_folder(folder: Path, repo: str, *, token: str, private: bool, message: str) -> str:
    """Create ``repo`` (kept if it exists) and upload ``folder`` as one commit; returns the repo's URL."""
    from huggingface_hub import HfApi

    # the HTTP client's own error base, as huggingface_hub imports it (httpx, or httpx2 in 2.x)
    from huggingface_hub.errors import HfHubHTTPError, HTTPError

    api = HfApi(token=token)
    try:
        # None: the owner's default (public unless an organisation says otherwise)
        url = api.create_repo(repo, private=True if private else None, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=url.repo_id, repo_type="model", commit_message=message)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        fix = _LOGIN if status in (401, 403) else "check the repo id and your access to it, then export again"
        raise UserError(f"the Hub refused the push to '{repo}' ({_first_line(exc)})", fix) from exc
    except (HTTPError, OSError) as exc:
        raise UserError(f"the Hub could not be reached to push to '{repo}' ({_first_line(exc)})",
                        "check the network (or HF_ENDPOINT), then export again") from exc
    return str(url)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
