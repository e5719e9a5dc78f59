mod common;

use attn_viz::heatmap::{Heatmap, write_heatmap};
use attn_viz::select::{Selection, select};
use attn_viz::words;

#[test]
fn heatmap_png_of_real_attention() {
    let maps = common::golden_maps("text01");
    let units = words::words(&maps).unwrap();
    let m = select(&maps, Selection::All).unwrap();
    let merged = words::merge_matrix(&m, maps.seq_len(), &units);
    let labels: Vec<String> = units.iter().map(|u| u.label.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.png");
    write_heatmap(
        &path,
        &Heatmap {
            title: "test",
            labels: &labels,
            matrix: &merged,
        },
    )
    .unwrap();
    std::fs::copy(&path, "/tmp/viz_check.png").unwrap();
}
