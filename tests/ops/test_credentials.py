from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import authenticate

from fleet.models import ApiKey, hash_api_key
from ops.stack.credentials import ensure_admin, ensure_api_key


@pytest.mark.django_db
def test_admin_password_is_generated_once_and_works(tmp_path: Path) -> None:
    user, password = ensure_admin(tmp_path)
    assert ensure_admin(tmp_path) == (user, password)
    assert authenticate(username=user, password=password) is not None
    assert (tmp_path / "admin_password").stat().st_mode & 0o777 == 0o600


@pytest.mark.django_db
def test_changed_admin_password_is_reset_to_a_printable_one(tmp_path: Path) -> None:
    user, first = ensure_admin(tmp_path)
    from django.contrib.auth.models import User

    account = User.objects.get(username=user)
    account.set_password("changed-elsewhere")
    account.save()
    _, second = ensure_admin(tmp_path)
    assert second != first
    assert authenticate(username=user, password=second) is not None


@pytest.mark.django_db
def test_api_key_is_stored_hashed_and_reissued_when_revoked(tmp_path: Path) -> None:
    raw = ensure_api_key(tmp_path)
    assert raw.startswith(ApiKey.PREFIX)
    assert ensure_api_key(tmp_path) == raw
    stored = ApiKey.objects.get()
    assert stored.key_hash == hash_api_key(raw) and raw not in stored.key_hash
    stored.revoked = True
    stored.save()
    fresh = ensure_api_key(tmp_path)
    assert fresh != raw
    assert ApiKey.objects.filter(revoked=False).count() == 1
