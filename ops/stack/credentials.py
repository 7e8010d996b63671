"""The demo's admin account and API key: generated once, kept in var/ (mode 0600) so a
restart prints the same credentials instead of invalidating the operator's copies."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model

from fleet.models import ApiKey, hash_api_key
from fleet.private_files import write_private

ADMIN_USERNAME = "admin"
DEMO_KEY_NAME = "demo"


@dataclass(frozen=True)
class Credentials:
    admin_username: str
    admin_password: str
    api_key: str


def _read_secret(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, value + "\n")


def ensure_admin(var_dir: Path) -> tuple[str, str]:
    """The admin user with a known password: the stored one if it still works, else a new one."""
    user_model = get_user_model()
    path = var_dir / "admin_password"
    password = _read_secret(path)
    user = user_model.objects.filter(username=ADMIN_USERNAME).first()
    if user is not None and password and user.check_password(password):
        return ADMIN_USERNAME, password
    password = secrets.token_urlsafe(12)
    if user is None:
        user_model.objects.create_superuser(ADMIN_USERNAME, "", password)
    else:
        user.set_password(password)
        user.is_staff = user.is_superuser = user.is_active = True
        user.save()
    _write_secret(path, password)
    return ADMIN_USERNAME, password


def ensure_api_key(var_dir: Path) -> str:
    """The demo API key: the stored one if it is still valid, else a newly issued one."""
    path = var_dir / "demo_api_key"
    raw = _read_secret(path)
    if raw and ApiKey.objects.filter(key_hash=hash_api_key(raw), revoked=False).exists():
        return raw
    _, raw = ApiKey.issue(DEMO_KEY_NAME)
    _write_secret(path, raw)
    return raw


def ensure_credentials(var_dir: Path) -> Credentials:
    username, password = ensure_admin(var_dir)
    return Credentials(username, password, ensure_api_key(var_dir))
