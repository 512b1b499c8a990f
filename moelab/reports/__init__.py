"""Reports: jinja2 templates with inline SVG charts, one self-contained file."""
