"""Mail over SMTP (STARTTLS, implicit TLS or plain; optional auth), with smtplib and email.message."""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path

from kf_culler.config import EmailSettings
from kf_culler.notify import SendError


def build(settings: EmailSettings, to: str, subject: str, body: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = settings.sender or ""
    msg["To"] = to
    if settings.cc:
        msg["Cc"] = ", ".join(settings.cc)
    msg["Subject"] = subject
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = make_msgid(domain=(settings.sender or "kf-culler").rpartition("@")[2] or None)
    msg["Auto-Submitted"] = "auto-generated"
    # Plain text as written (lines stay under SMTP's 998): readable in any client, greppable in the raw mail.
    msg.set_content(body, cte="7bit" if body.isascii() else "8bit")
    return msg


def send(settings: EmailSettings, msg: EmailMessage, timeout: float) -> None:
    """One attempt. Raises SendError: transient for connection problems and 4xx replies, else permanent."""
    assert settings.host is not None
    context = ssl.create_default_context(cafile=settings.ca_file) if settings.tls != "none" else None
    try:
        smtp: smtplib.SMTP
        if settings.tls == "implicit":
            smtp = smtplib.SMTP_SSL(settings.host, settings.port, timeout=timeout, context=context)
        else:
            smtp = smtplib.SMTP(settings.host, settings.port, timeout=timeout)
        with smtp:
            if settings.tls == "starttls":
                smtp.starttls(context=context)
            if settings.username:
                password = Path(settings.password_file).read_text().strip() if settings.password_file else ""
                smtp.login(settings.username, password)
            refused = smtp.send_message(msg)
            if refused:
                codes = sorted({code for code, _ in refused.values()})
                raise SendError(f"SMTP refused {len(refused)} recipient(s): {codes}", transient=False)
    except SendError:
        raise
    except smtplib.SMTPRecipientsRefused as err:
        codes = sorted({code for code, _ in err.recipients.values()})
        raise SendError(f"SMTP {codes[0]}: recipients refused", transient=all(400 <= c < 500 for c in codes)) \
            from None
    except smtplib.SMTPResponseException as err:
        text = err.smtp_error.decode(errors="replace") if isinstance(err.smtp_error, bytes) else str(err.smtp_error)
        raise SendError(f"SMTP {err.smtp_code}: {text[:200]}", transient=400 <= err.smtp_code < 500) from None
    except (smtplib.SMTPServerDisconnected, smtplib.SMTPConnectError, TimeoutError, ConnectionError) as err:
        raise SendError(f"SMTP {type(err).__name__}: {str(err)[:200]}", transient=True) from None
    except (ssl.SSLError, smtplib.SMTPNotSupportedError, smtplib.SMTPException, OSError) as err:
        raise SendError(f"SMTP {type(err).__name__}: {str(err)[:200]}", transient=False) from None
