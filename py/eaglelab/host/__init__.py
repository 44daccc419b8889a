"""Host side: what runs on each GPU host (started over ssh as `python -m eaglelab.host.X`):
jobwrap wraps a stage command, hostside answers the controller, hostfacts reports the host,
tail/ follows logs and parse/ turns them into the state JSON. Imports nothing from control/."""
