"""A PostgreSQL refusal read from libpq's trace and given its fix in any of the server's
languages (`ledger.stores.pg_refusals`): the words as PostgreSQL 15's translations put
them, the code as the trace shows it. The servers themselves: tests/integration/
test_pg_refusals.py."""

from __future__ import annotations

import pytest

from ledger.stores.pg_refusals import (
    PASSWORD_FIX,
    ROLE_FIX,
    ServerRefusal,
    refusal_fix,
    refusal_in,
)
from ledger.stores.url import PostgresStore

STORE = PostgresStore(dbname="mail", host="db.example.com", port=5432, user="mail", password="x")
LINE = "the server's pg_hba.conf needs the line 'host mail mail 10.0.0.9/32 scram-sha-256'"

#: pg_hba.conf refusals as PostgreSQL 15's translations word them (postgres-15.mo), the
#: client's address first, quoted each language's way; French breaks its line.
TRANSLATED_HBA = {
    "de": "kein pg_hba.conf-Eintrag für Host »10.0.0.9«, Benutzer »mail«, Datenbank »mail«",
    "fr": "aucune entrée dans pg_hba.conf pour l'hôte « 10.0.0.9 », utilisateur « mail »,\n"
    "base de données « mail »",
    "es": "no hay una línea en pg_hba.conf para «10.0.0.9», usuario «mail», base de datos «mail»",
    "ko": '호스트 "10.0.0.9", 사용자 "mail", 데이터베이스 "mail" 연결에 대한 설정이 '
    "pg_hba.conf 파일에 없습니다.",
    "zh_CN": '没有用于主机 "10.0.0.9", 用户 "mail", 数据库 "mail" 的 pg_hba.conf 记录',
}


@pytest.mark.parametrize("language", sorted(TRANSLATED_HBA))
def test_a_translated_pg_hba_refusal_names_the_line_for_its_address(language: str) -> None:
    refusal = ServerRefusal("28000", TRANSLATED_HBA[language])
    assert refusal_fix(STORE, "", refusal, needs_password=False).startswith(LINE)


def test_the_code_not_the_words_picks_the_fix() -> None:
    german = "Passwort-Authentifizierung für Benutzer »mail« fehlgeschlagen"
    assert refusal_fix(STORE, german, ServerRefusal("28P01", german), False) == PASSWORD_FIX
    assert refusal_fix(STORE, german, None, False) == ""  # by its words: not recognized
    role = "Rolle »mail« existiert nicht"
    assert refusal_fix(STORE, role, ServerRefusal("28000", role), False) == ROLE_FIX
    full = "zu viele Verbindungen von Rolle »mail«"
    assert refusal_fix(STORE, full, ServerRefusal("53300", full), False) == ""


def test_the_trace_s_error_response_is_read_with_words_over_two_lines() -> None:
    french = TRANSLATED_HBA["fr"]
    trace = (
        '2026-12-04 18:47:05.229992\tF\t38\tStartupMessage\t 3 0 "user" "mail" "database" '
        '"mail"\n2026-12-04 18:47:05.230910\tB\t154\tErrorResponse\t S "FATAL" V "FATAL" '
        f'C "28000" M "{french}" F "auth.c" L "544" R "ClientAuthentication" \\x00\n'
    )
    assert refusal_in(trace) == ServerRefusal("28000", french)
    assert refusal_in(trace.replace("ErrorResponse", "NoticeResponse")) is None
