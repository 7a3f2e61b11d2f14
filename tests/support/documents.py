"""Source documents the extraction tests write."""


def transcript(names: list[str], extra: str = "") -> str:
    parts = "\n".join(f'  - "{n}"' for n in names)
    body = " ".join(names)
    return f"---\nmeeting_id: M\nparticipants:\n{parts}\n---\n# Meeting\n\n**Chair:** {body}. {extra}\n"
