//! The coverage table of `tests/COVERAGE.md` is checked against the sources on every run, so it
//! cannot drift from the tests: every lifecycle behaviour L1–L68 has a row; every row says what
//! covers it (a test, a decision of `src/provider/DECISIONS.md` with its test, a reason it does
//! not apply, or that it is being built); every test it names exists (a `#[test]` function in
//! the file named, or a case of a policy's case table); every end-to-end test it names names the
//! row back in its doc comment (so `grep` over the tests finds a row's tests); and every row an
//! end-to-end test's doc comment names is in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

const LIFECYCLE_ROWS: usize = 68;

/// One row of the table: its id and what covers it (the last cell).
struct Row {
    id: String,
    covered_by: String,
}

/// The rows of the tables under the `## Coverage, row by row` heading.
fn rows(coverage: &str) -> Vec<Row> {
    let Some((_, section)) = coverage.split_once("## Coverage, row by row") else {
        return vec![];
    };
    let id = Regex::new(r"^(L\d+|[A-Za-z_]+/\w+)$").unwrap();
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().strip_prefix('|')?.strip_suffix('|')?.split(" | ").collect();
            let (first, last) = (cells.first()?.trim(), cells.last()?.trim());
            id.is_match(first).then(|| Row {
                id: first.to_string(),
                covered_by: last.to_string(),
            })
        })
        .collect()
}

/// Whether `text` names `id` as a whole token (`L1` is not named by `L17`, nor
/// `create_test/CloneMode` by `create_test/CloneModeWithTag`).
fn names(text: &str, id: &str) -> bool {
    let re = Regex::new(&format!(r"(^|[^\w/]){}($|[^\w])", regex::escape(id))).unwrap();
    re.is_match(text)
}

/// The doc comment and attributes above `fn name` in `source`, if a test function of that
/// name is there.
fn test_fn<'a>(source: &'a str, name: &str) -> Option<(Vec<&'a str>, Vec<&'a str>)> {
    let lines: Vec<&str> = source.lines().collect();
    let decl = Regex::new(&format!(r"^\s*(pub )?(async )?fn {}\s*[<(]", regex::escape(name))).unwrap();
    let at = lines.iter().position(|l| decl.is_match(l))?;
    let (mut docs, mut attrs) = (vec![], vec![]);
    for line in lines[..at].iter().rev().map(|l| l.trim()) {
        if let Some(doc) = line.strip_prefix("///") {
            docs.push(doc);
        } else if line.starts_with("#[") {
            attrs.push(line);
        } else {
            break;
        }
    }
    attrs
        .iter()
        .any(|a| a.starts_with("#[test]") || a.starts_with("#[tokio::test"))
        .then(|| (docs.into_iter().rev().collect(), attrs))
}

fn is_end_to_end(path: &str) -> bool {
    path.starts_with("tests/integration/") || path.starts_with("tests/real_apiserver/")
}

/// Everything wrong with the table `coverage`, given the decisions file and a reader of the
/// repository's files (by path relative to its root).
fn problems(coverage: &str, decisions: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = vec![];
    let rows = rows(coverage);
    let mut seen = BTreeSet::new();
    for row in &rows {
        if !seen.insert(row.id.as_str()) {
            out.push(format!("{}: listed twice", row.id));
        }
    }
    for n in 1..=LIFECYCLE_ROWS {
        if !seen.contains(format!("L{n}").as_str()) {
            out.push(format!("L{n}: the lifecycle behaviour has no row"));
        }
    }
    let reference = Regex::new(r"`([^`]+?)::([^`]+)`").unwrap();
    let decision = Regex::new(r"\bdecision (\d+)\b").unwrap();
    let reason = Regex::new(r"n\.a\.: *\S").unwrap();
    let mut files: BTreeMap<String, Option<String>> = BTreeMap::new();
    for row in &rows {
        let cell = &row.covered_by;
        let refs: Vec<(String, String)> = reference
            .captures_iter(cell)
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect();
        if refs.is_empty() && !reason.is_match(cell) && !cell.contains("being built") {
            out.push(format!(
                "{}: neither a test, nor a decision with its test, nor a reason",
                row.id
            ));
        }
        for d in decision.captures_iter(cell) {
            if !decisions.lines().any(|l| l.starts_with(&format!("| {} |", &d[1]))) {
                out.push(format!("{}: decision {} is not in DECISIONS.md", row.id, &d[1]));
            }
            if refs.is_empty() {
                out.push(format!("{}: decision {} is named without its test", row.id, &d[1]));
            }
        }
        for (path, name) in refs {
            let source = files.entry(path.clone()).or_insert_with(|| read(&path));
            let Some(source) = source else {
                out.push(format!("{}: {path} does not exist", row.id));
                continue;
            };
            if path.ends_with(".yaml") {
                if !source.lines().any(|l| l.trim() == format!("- name: {name}")) {
                    out.push(format!("{}: {path} has no case named {name:?}", row.id));
                }
                continue;
            }
            match test_fn(source, &name) {
                None => out.push(format!("{}: {path} has no test named {name}", row.id)),
                Some((docs, _)) if is_end_to_end(&path) && !names(&docs.join("\n"), &row.id) => out.push(format!(
                    "{}: the end-to-end test {path}::{name} does not name the row in its doc comment",
                    row.id
                )),
                Some(_) => {}
            }
        }
    }
    out
}

/// Rows named in the doc comments of the end-to-end tests under `dir` that the table lacks.
fn unknown_rows_named(dir: &Path, root: &Path, table: &BTreeSet<String>, out: &mut Vec<String>) {
    let row = Regex::new(r"(?:^|[^\w/])(L\d+|[a-z_]+_test/\w+|snapshots/\w+|meta/\w+)").unwrap();
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            unknown_rows_named(&path, root, table, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for line in source.lines().filter(|l| l.trim_start().starts_with("///")) {
            // Only lines that name rows: "Lifecycle:", "Checklist rows:" and their continuations.
            for c in row.captures_iter(line) {
                let id = &c[1];
                if !table.contains(id) && (id.contains('/') || line.contains("Lifecycle:")) {
                    out.push(format!(
                        "{}: names row {id}, which tests/COVERAGE.md does not list",
                        path.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
}

#[test]
fn the_coverage_table_names_real_tests_and_every_lifecycle_behaviour() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let coverage = std::fs::read_to_string(root.join("tests/COVERAGE.md")).unwrap();
    let decisions = std::fs::read_to_string(root.join("src/provider/DECISIONS.md")).unwrap();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let mut found = problems(&coverage, &decisions, &read);
    let table: BTreeSet<String> = rows(&coverage).into_iter().map(|r| r.id).collect();
    unknown_rows_named(&root.join("tests/integration"), root, &table, &mut found);
    assert!(found.is_empty(), "tests/COVERAGE.md:\n{}", found.join("\n"));
    // The figures the README and a reader quote: rows, and what covers them.
    let rows = rows(&coverage);
    let count = |f: &dyn Fn(&Row) -> bool| rows.iter().filter(|r| f(r)).count();
    eprintln!(
        "{} rows: {} by a test, {} by a decision, {} being built, {} not applicable",
        rows.len(),
        count(&|r| r.covered_by.contains('`')
            && !r.covered_by.contains("decision ")
            && !r.covered_by.contains("being built")),
        count(&|r| r.covered_by.contains("decision ")),
        count(&|r| r.covered_by.contains("being built")),
        count(&|r| r.covered_by.starts_with("n.a.")),
    );
}

/// The checker itself: each kind of mistake in a table is reported.
#[test]
fn each_kind_of_mistake_in_the_table_is_reported() {
    let files: BTreeMap<&str, &str> = [
        (
            "tests/integration/e2e.rs",
            "/// Lifecycle: L1.\n#[tokio::test]\nasync fn named_back() {}\n\n#[tokio::test]\nasync fn silent() {}\n\nfn not_a_test() {}\n",
        ),
        ("policies/p/p.cases.yaml", "cases:\n  - name: a case\n"),
    ]
    .into();
    let read = |p: &str| files.get(p).map(|s| s.to_string());
    let decisions = "| # | a | b |\n|---|---|---|\n| 3 | x | y |\n";
    let mut table = String::from("## Coverage, row by row\n\n| Row | Covered by |\n|---|---|\n");
    for n in 2..=LIFECYCLE_ROWS {
        table.push_str(&format!("| L{n} | n.a.: fixture |\n"));
    }
    let good = format!("{table}| L1 | `tests/integration/e2e.rs::named_back`; `policies/p/p.cases.yaml::a case` |\n");
    assert_eq!(problems(&good, decisions, &read), Vec::<String>::new());
    let bad = [
        ("| L1 | `tests/integration/e2e.rs::gone` |", "has no test named gone"),
        (
            "| L1 | `tests/integration/e2e.rs::not_a_test` |",
            "has no test named not_a_test",
        ),
        ("| L1 | `tests/integration/e2e.rs::silent` |", "does not name the row"),
        ("| L1 | `tests/integration/nowhere.rs::x` |", "does not exist"),
        ("| L1 | `policies/p/p.cases.yaml::another case` |", "has no case named"),
        (
            "| L1 | decision 9; `tests/integration/e2e.rs::named_back` |",
            "decision 9 is not in DECISIONS.md",
        ),
        ("| L1 | decision 3 |", "named without its test"),
        ("| L1 | tested somewhere |", "neither a test"),
        ("| L1 | n.a.: |", "neither a test"),
        ("| L2 | n.a.: twice |", "listed twice"),
    ];
    for (row, expected) in bad {
        let found = problems(&format!("{table}{row}\n"), decisions, &read);
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{row}: expected a problem with {expected:?}, got {found:?}"
        );
    }
    let found = problems(&table, decisions, &read);
    assert!(
        found
            .iter()
            .any(|p| p.contains("L1: the lifecycle behaviour has no row")),
        "{found:?}"
    );
}
