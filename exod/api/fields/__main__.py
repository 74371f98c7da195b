"""`python -m exod.api.fields`: write docs/api-fields.md from the field tables."""

from exod.api.fields import DIALECTS
from exod.api.fields.docs import PAGE, render

PAGE.write_text(render(DIALECTS), encoding="utf-8")
print(f"wrote {PAGE}")
