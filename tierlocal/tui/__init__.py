"""``tierlocal ui``: the terminal UI, in Textual. What fits (the catalog planned for a machine,
filtered, sorted and replanned by key) and Live (the running serves, the gateway, spend).

Apart from the CLI, the only package that draws on a terminal (Textual, and rich inside it);
it shows what the library computes and never computes a figure of its own."""
