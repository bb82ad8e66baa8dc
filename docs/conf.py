# Sphinx configuration of xshard's documentation: Markdown pages (MyST) and an API reference
# that Breathe renders from Doxygen's XML of the headers' /// comments.
#
# scripts/docs.sh runs Doxygen and then Sphinx with warnings as errors. This file also
#  - writes the API reference's pages (api/generated/, one per folder of include/xshard/, one
#    section per header), so that a header added, split or removed needs no edit here;
#  - works around three limits of Breathe 4.34 on Doxygen 1.9 (see the end of the file).

import os
import pathlib
import re
import xml.etree.ElementTree as ElementTree

here = pathlib.Path(__file__).resolve().parent
root = here.parent
include = root / "include" / "xshard"
xml = pathlib.Path(os.environ.get("XSHARD_DOXYGEN_XML", root / "build" / "docs" / "xml"))
if not (xml / "index.xml").is_file():
    raise RuntimeError(f"no Doxygen XML in {xml}: build the documentation with scripts/docs.sh")

project = "xshard"
author = "xshard's authors"
copyright = "xshard's authors"
extensions = ["breathe", "myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"
primary_domain = "cpp"
highlight_language = "cpp"
myst_heading_anchors = 3
html_theme = "furo"
html_title = "xshard"
html_static_path = ["_static"]
html_css_files = ["xshard.css"]
html_show_sourcelink = False
breathe_projects = {"xshard": str(xml)}
breathe_default_project = "xshard"
breathe_default_members = ("members",)
breathe_show_include = True
cpp_index_common_prefix = ["xshard::"]

# References the pages make to xshard's names must resolve; names of other libraries
# (std::, xt::, MPI) and template parameters in the rendered signatures are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"cpp:.*", r"^(?!xshard::).*")]

# ---------------------------------------------------------------------------------------------
# The API reference's pages: the floors of include/xshard/ from the bottom up (the order of
# DESIGN's floor list), then any other folder, then the headers at the top (the umbrella).

floors = {
    "comm": "MPI: environment, communicators, collectives, node shared memory, errors",
    "core": "meshes, layouts, strategies, the block partition",
    "tensor": "distributed tensors: making, gathering, drawing",
    "param": "parameters, weights and their traversal",
    "redistribute": "redistribution: planner, plans, cost model, batched, cross-mesh and halo steps",
    "ops": "operations with sharding rules (namespace xshard::ops)",
    "data": "datasets, views, readers and the loader (namespace xshard::data)",
    "train": "broadcast, gradient synchronisation, optimizer sharding, norms, monitor",
    "nn": "parallel layers (namespace xshard::nn)",
    "optim": "optimizers and learning-rate schedules (namespace xshard::optim)",
    "io": "checkpoints, strategy files, operator strategy and group files",
    "pipeline": "pipeline parallelism (namespace xshard::pipeline)",
    "shard": "shard() and shard_local()",
    "graph": "programs: tracing, one description per primitive, compiling onto a mesh",
    "search": "strategy search: cost model, calibration, sharding propagation, recursive programming",
    "models": "ready networks: ResNet and the transformer block as programs",
    "driver": "AutoParallel's configuration, the training driver and its callbacks",
}


def write_if_changed(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def brief_of(header):
    """The first sentence of a header's comment (its \\file comment, else its first ///
    block)."""
    text = header.read_text().splitlines()
    start = next((i + 1 for i, line in enumerate(text) if line.strip() == "/// \\file"), None)
    if start is None:
        start = next((i for i, line in enumerate(text) if line.strip().startswith("///")), 0)
    lines = []
    for line in text[start:]:
        s = line.strip()
        if not s.startswith("///") or s == "///":
            break
        lines.append(s[3:].strip())
    m = re.match(r"(.+?[.:])(\s|$)", " ".join(lines))
    return (m.group(1) if m else " ".join(lines)).rstrip(":.")


namespaces = {
    "xshard": "meshes, layouts, tensors, redistribution, parameters, training collectives, "
              "checkpoints: everything without a namespace of its own below",
    "xshard::mpi": "typed MPI collectives over contiguous buffers (found unqualified by argument-"
                   "dependent lookup in calls with a communicator)",
    "xshard::ops": "operations on distributed tensors",
    "xshard::nn": "layers",
    "xshard::optim": "optimizers and schedules",
    "xshard::data": "datasets, views, readers, the loader",
    "xshard::pipeline": "schedules, stages and the pipeline runtime",
    "xshard::callbacks": "the training driver's callbacks",
}


def doxygen_ids():
    """Doxygen's ids of the headers (by path, `xshard/core/mesh.hpp`) and of the namespaces."""
    files, spaces = {}, {}
    for compound in ElementTree.parse(xml / "index.xml").getroot():
        kind, refid = compound.get("kind"), compound.get("refid")
        if kind == "file":
            location = ElementTree.parse(xml / f"{refid}.xml").find("compounddef/location")
            if location is not None:
                files[location.get("file")] = refid
        elif kind == "namespace" and compound.findtext("name").startswith("xshard"):
            spaces[compound.findtext("name")] = refid
    return files, spaces


def write_api_pages():
    out = here / "api" / "generated"
    file_ids, namespace_ids = doxygen_ids()
    folders = sorted((d.name for d in include.iterdir() if d.is_dir()),
                     key=lambda f: (list(floors).index(f) if f in floors else len(floors), f))
    pages = []
    for folder in folders:
        headers = sorted((include / folder).rglob("*.hpp"))
        if headers:
            pages.append((folder, f"xshard/{folder}/", headers))
    top = sorted(include.glob("*.hpp"))
    if top:
        pages.append(("headers", "xshard/", top))
    written = set()
    toc = ["| folder | what it holds |", "| --- | --- |"]
    for name, prefix, headers in pages:
        title = floors.get(name, "the umbrella headers" if name == "headers" else name)
        text = [f"# `{prefix}`", "",
                "<!-- Written by docs/conf.py from the headers; edits here are overwritten. -->", "",
                title[0].upper() + title[1:] + ".", ""]
        paths = [h.relative_to(include.parent).as_posix() for h in headers]
        text += [f"- [`{path}`](#{anchor(path)}): {brief_of(h)}" for path, h in zip(paths, headers)]
        text.append("")
        for path in paths:
            if path in file_ids:  # the target of links to the header
                text += [f"({file_ids[path]})=", ""]
            text += [f"## `{path}`", "", f"```{{doxygenfile}} {path}", "```", ""]
        write_if_changed(out / f"{name}.md", "\n".join(text))
        written.add(f"{name}.md")
        toc.append(f"| [`{prefix}`](generated/{name}.md) | {title} |")
    toc += ["", "Namespaces:", ""]
    for name in sorted(namespace_ids):
        toc += [f"({namespace_ids[name]})=", "", f"`{name}`: {namespaces.get(name, '')}", ""]
    toc += ["", "```{toctree}", ":hidden:", ""]
    toc += [f"generated/{name}" for name, _, _ in pages]
    toc += ["```", ""]
    write_if_changed(out / "toc.inc", "\n".join(toc))
    for stale in out.glob("*.md"):
        if stale.name not in written:
            stale.unlink()


def anchor(title):
    """MyST's anchor of a heading `title` (in backticks): GitHub's slug rule."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


write_api_pages()

# ---------------------------------------------------------------------------------------------
# Breathe 4.34 on Doxygen 1.9: three workarounds, none of which hides a problem of the docs.
#
# 1. Doxygen lists a class template's deduction guide (`loader(const Mesh&, R&&, ...) ->
#    loader<...>`) as a function named like the class; Sphinx then declares the class twice
#    and nests the class's members in a "function". The guides are taken out of the XML.
guide = re.compile(
    r'<memberdef kind="function"[^>]*>(?:(?!</memberdef>).)*?<type></type>\s*'
    r"<definition>[^<]*</definition>\s*<argsstring>\([^<]*\) -&gt;[^<]*</argsstring>"
    r"(?:(?!</memberdef>).)*?</memberdef>\s*", re.S)
for f in xml.glob("*.xml"):
    text = f.read_text()
    kept = guide.sub("", text)
    if kept != text:
        f.write_text(kept)

from breathe.renderer import sphinxrenderer as _renderer  # noqa: E402
from breathe.renderer import target as _target  # noqa: E402

# 2. `doxygenfile` declares each namespace the header opens as a C++ entity, once per header:
#    every header after the first would redeclare `xshard`. In a file's page the namespace's
#    members are rendered directly instead, with their qualified names.
_visit_namespace = _renderer.SphinxRenderer.visit_namespace


def visit_namespace(self, node):
    if self.context.directive_args[0] != "doxygenfile":
        return _visit_namespace(self, node)
    data = self.compound_parser.parse(node.refid)
    return self.render(data, self.context.create_child_context(data))


_renderer.SphinxRenderer.visit_namespace = visit_namespace

#    The functions, variables, types and enums of a namespace come from the file's own
#    sections, outside any namespace: their namespace is read from their Doxygen id
#    (`namespacexshard_1_1ops_1a...` is a member of xshard::ops).
def namespace_of(refid):
    m = re.match(r"namespace(.+?)_1[a-z0-9]+$", refid or "")
    if not m:
        return []
    return [part.replace("__", "_") for part in m.group(1).split("_1_1")]


_dispatch_memberdef = _renderer.SphinxRenderer.methods["memberdef"]


def dispatch_memberdef(self, node):
    previous = getattr(self, "xshard_member", None)
    self.xshard_member = node
    try:
        return _dispatch_memberdef(self, node)
    finally:
        self.xshard_member = previous


_get_qualification = _renderer.SphinxRenderer.get_qualification


def get_qualification(self):
    names = _get_qualification(self)
    member = getattr(self, "xshard_member", None)
    if (not names and member is not None and self.nesting_level == 0
            and self.context.directive_args[0] == "doxygenfile"):
        return namespace_of(getattr(member, "id", None))
    return names


_renderer.SphinxRenderer.methods["memberdef"] = dispatch_memberdef
_renderer.SphinxRenderer.get_qualification = get_qualification

# 3. Doxygen gives partial specialisations that differ only in their constraints
#    (`reduction_traits<T>` for `summable T` and for `sixteen_bit_float T`) one id; the
#    second keeps its text and leaves the link target to the first.
_create_target = _target._RealTargetHandler.create_target


def create_target(self, refid):
    if refid in self.document.ids:
        return []
    return _create_target(self, refid)


_target._RealTargetHandler.create_target = create_target


# 4. Inside the reference's own pages, Breathe links each name of a signature or comment that
#    Doxygen knows: implementation details left out of the reference, template parameters,
#    primary templates that are only declared. Those links stay text. References the other
#    pages make are checked (nitpicky above).
def unlinked_in_reference(app, env, node, contnode):
    if env.docname.startswith("api/generated/") and node.get("refdomain") in ("cpp", "std"):
        return contnode
    return None


def setup(app):
    app.connect("missing-reference", unlinked_in_reference)
