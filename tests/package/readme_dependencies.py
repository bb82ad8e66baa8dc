#!/usr/bin/env python3
"""Checks that README.md's dependency list and scripts/install_deps.sh name the same Debian
packages: the apt-get line a user copies (what find_package(xshard) needs) plus the packages
the README lists for xshard's own tests, tools, benchmarks and documentation, against what
the test script installs (ccache aside: optional, used when present).

    readme_dependencies.py README.md scripts/install_deps.sh
"""
import re
import sys


def main():
    readme, script = (open(p).read() for p in sys.argv[1:3])
    section = readme.split("## Dependencies (Debian packages)", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"sudo apt-get install ((?:.|\n)*?)\n```", section)
    if not command:
        sys.exit("README.md: no apt-get install command under 'Dependencies (Debian packages)'")
    for_users = set(command.group(1).replace("\\", " ").split())
    also = re.search(r"also ((?:.|\n)*?);", section)
    for_xshard = set(re.findall(r"[a-z0-9][a-z0-9.+-]*-dev|ninja-build|python3-[a-z]+(?:-[a-z]+)*|doxygen|furo",
                                also.group(1)))
    listed = re.search(r"packages=\(((?:.|\n)*?)\)", script)
    installed = set(listed.group(1).split()) - {"ccache"}
    documented = for_users | for_xshard
    problems = []
    if installed - documented:
        problems.append("installed by install_deps.sh, not in README.md: " + ", ".join(sorted(installed - documented)))
    if documented - installed:
        problems.append("in README.md, not installed by install_deps.sh: " + ", ".join(sorted(documented - installed)))
    if problems:
        sys.exit("\n".join(problems))
    print(f"README.md and install_deps.sh name the same {len(installed)} packages "
          f"({len(for_users)} for users of the package)")


if __name__ == "__main__":
    main()
