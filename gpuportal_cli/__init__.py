"""The GPU portal's command-line client (``gpuportal``): HTTP to the REST API only, no Django."""
