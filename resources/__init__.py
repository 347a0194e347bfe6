"""Data files shipped with MTP Chat (styles, icons, the catalog, the embedded demo model).

A package only so that a regular (non-editable) install carries the folder; code finds it
through ``engine.resources.resources_dir()``, never by importing this.
"""
