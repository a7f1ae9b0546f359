"""An app whose import fails: ``brooq supervise`` must refuse to start."""

raise RuntimeError("sysapp_broken refuses to import")
