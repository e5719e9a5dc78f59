//! Every file of `tests/data/sdpa` through the reference and the fast path.

mod common;

use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnOutput, Weights, WeightsRequest, sdpa, sdpa_reference,
};
use common::{assert_close, golden_files, load_case};

type Kernel = fn(&AttnInput<'_>, &AttnOptions) -> Result<AttnOutput, AttnError>;

fn check_all(kernel: Kernel) {
    let files = golden_files("sdpa");
    assert_eq!(files.len(), 65, "tests/data/sdpa should hold 65 cases");
    for path in files {
        let case = load_case(&path);
        let input = AttnInput::new(&case.q, &case.k, &case.v, case.shape).unwrap();
        let options = AttnOptions {
            weights: WeightsRequest::All,
            ..case.options.clone()
        };
        let got = kernel(&input, &options).unwrap();
        assert_close(
            "out",
            &case.name,
            &got.out,
            &case.expected_out,
            case.tolerance,
        );
        assert_close("lse", &case.name, &got.lse, &case.expected_lse, 1e-4);
        let Some(Weights::All { data: w, .. }) = got.weights else {
            panic!("{}: no weights", case.name)
        };
        assert_close(
            "weights",
            &case.name,
            &w,
            &case.expected_weights,
            case.tolerance,
        );
    }
}

#[test]
fn reference_matches_every_golden_case() {
    check_all(sdpa_reference);
}

#[test]
fn fast_path_matches_every_golden_case() {
    check_all(sdpa);
}
