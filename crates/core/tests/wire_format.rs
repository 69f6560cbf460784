//! The JSON of what is kept and sent (gallery items and index, results) stays as it was: each literal
//! is what the code wrote before the image parameters became one type (`ImageParams`), and must parse
//! and come back byte for byte; a renamed field keeps its key.

use imagine_core::api::{Event, GenerateResult};
use imagine_core::gallery::{GalleryIndex, GalleryItem};
use imagine_core::image::ImageParams;
use serde::{de::DeserializeOwned, Serialize};

/// A result with timings, no trace, not private (so no `private` key).
const RESULT: &str = r#"{"job":"0123abcd","png":"iVBORw0KGgo=","prompt":"a red fox «ü» \"quoted\"\nline two","seed":"18446744073709551615","width":512,"height":768,"steps":4,"schedule":"empirical","tokenCount":17,"truncated":false,"trace":null,"timings":{"sessionCreateMs":500.0,"runMs":1200.75,"totalMs":2000.0,"stages":[{"stage":"textEncoder","graphFile":"text_encoder.onnx","fusedAttention":0,"chunkedAttention":0,"pieces":1,"storedFormCheckMs":0.0,"workerCreatedAtMs":1700000000001.5,"taskAtMs":1700000000010.0,"startedAtMs":1700000000011.0,"finishedAtMs":1700000000900.25,"sessionCreateMs":500.0,"resident":false,"runMs":300.5,"runsMs":[300.5]}],"budget":4000000000},"index":1,"count":2}"#;

/// A private result with a trace and no timings.
const PRIVATE_RESULT: &str = r#"{"job":"4567cdef","png":"","prompt":"private","seed":"0","width":256,"height":256,"steps":1,"schedule":"linear-shift","tokenCount":1,"truncated":true,"trace":{"inputIds":[1,2,3],"attentionMask":[1,1,0],"sigmas":[1.0,0.5,0.0],"noise":"AAAA","firstVelocity":"BBBB","imgIds":"CCCC","txtIds":"DDDD","promptEmbeds":"EEEE"},"timings":null,"index":0,"count":1,"private":true}"#;

/// The `result` event.
const RESULT_EVENT: &str = r#"{"type":"result","job":"0123abcd","png":"iVBORw0KGgo=","prompt":"a red fox «ü» \"quoted\"\nline two","seed":"18446744073709551615","width":512,"height":768,"steps":4,"schedule":"empirical","tokenCount":17,"truncated":false,"trace":null,"timings":{"sessionCreateMs":500.0,"runMs":1200.75,"totalMs":2000.0,"stages":[{"stage":"textEncoder","graphFile":"text_encoder.onnx","fusedAttention":0,"chunkedAttention":0,"pieces":1,"storedFormCheckMs":0.0,"workerCreatedAtMs":1700000000001.5,"taskAtMs":1700000000010.0,"startedAtMs":1700000000011.0,"finishedAtMs":1700000000900.25,"sessionCreateMs":500.0,"resident":false,"runMs":300.5,"runsMs":[300.5]}],"budget":4000000000},"index":1,"count":2}"#;

/// A gallery item with timings and the pack's commit.
const ITEM: &str = r#"{"id":"0123abcd-1","prompt":"a red fox «ü» \"quoted\"\nline two","seed":"18446744073709551615","width":512,"height":768,"steps":4,"schedule":"empirical","created":1700000000123.0,"bytes":456789,"timings":{"sessionCreateMs":500.0,"runMs":1200.75,"totalMs":2000.0,"stages":[{"stage":"textEncoder","graphFile":"text_encoder.onnx","fusedAttention":0,"chunkedAttention":0,"pieces":1,"storedFormCheckMs":0.0,"workerCreatedAtMs":1700000000001.5,"taskAtMs":1700000000010.0,"startedAtMs":1700000000011.0,"finishedAtMs":1700000000900.25,"sessionCreateMs":500.0,"resident":false,"runMs":300.5,"runsMs":[300.5]}],"budget":4000000000},"packCommit":"abc123"}"#;

/// The index file: an item rebuilt from its PNG, then [`ITEM`].
const INDEX: &str = r#"{"version":1,"limit":{"maxItems":500,"maxBytes":2000000000},"items":[{"id":"old","prompt":"old","seed":"7","width":256,"height":256,"steps":3,"schedule":"linear-shift","created":1600000000000.0,"bytes":1000,"timings":null,"packCommit":null},{"id":"0123abcd-1","prompt":"a red fox «ü» \"quoted\"\nline two","seed":"18446744073709551615","width":512,"height":768,"steps":4,"schedule":"empirical","created":1700000000123.0,"bytes":456789,"timings":{"sessionCreateMs":500.0,"runMs":1200.75,"totalMs":2000.0,"stages":[{"stage":"textEncoder","graphFile":"text_encoder.onnx","fusedAttention":0,"chunkedAttention":0,"pieces":1,"storedFormCheckMs":0.0,"workerCreatedAtMs":1700000000001.5,"taskAtMs":1700000000010.0,"startedAtMs":1700000000011.0,"finishedAtMs":1700000000900.25,"sessionCreateMs":500.0,"resident":false,"runMs":300.5,"runsMs":[300.5]}],"budget":4000000000},"packCommit":"abc123"}]}"#;

/// `json` parsed as `T` and written again.
fn round_trip<T: Serialize + DeserializeOwned>(json: &str) -> (T, String) {
    let value: T = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let again = serde_json::to_string(&value).unwrap();
    (value, again)
}

#[test]
fn a_result_and_its_event_are_written_as_before() {
    for json in [RESULT, PRIVATE_RESULT] {
        assert_eq!(round_trip::<GenerateResult>(json).1, json);
    }
    let (event, again) = round_trip::<Event>(RESULT_EVENT);
    assert_eq!(again, RESULT_EVENT);
    let result: GenerateResult = serde_json::from_str(RESULT).unwrap();
    assert_eq!(event, Event::Result(result.clone()));
    let image = ImageParams {
        prompt: "a red fox «ü» \"quoted\"\nline two".into(),
        seed: u64::MAX,
        width: 512,
        height: 768,
        steps: 4,
        schedule: "empirical".into(),
    };
    assert_eq!(result.image, image);
    assert_eq!((result.token_count, result.index, result.count, result.private), (17, 1, 2, false));
    let private: GenerateResult = serde_json::from_str(PRIVATE_RESULT).unwrap();
    assert_eq!(
        (private.image.seed, private.image.schedule.as_str(), private.private),
        (0, "linear-shift", true)
    );
}

#[test]
fn a_gallery_item_and_the_index_are_written_as_before() {
    assert_eq!(round_trip::<GalleryItem>(ITEM).1, ITEM);
    let index = GalleryIndex::parse(INDEX.as_bytes()).unwrap();
    assert_eq!(String::from_utf8(index.to_bytes()).unwrap(), INDEX);
    assert_eq!(index.items[1], serde_json::from_str::<GalleryItem>(ITEM).unwrap());
    // The item the service worker lists for the result, as it writes it.
    let result: GenerateResult = serde_json::from_str(RESULT).unwrap();
    let item = GalleryItem {
        id: "0123abcd-1".into(),
        image: result.image,
        created: 1_700_000_000_123.0,
        bytes: 456_789,
        timings: result.timings,
        pack_commit: Some("abc123".into()),
    };
    assert_eq!(serde_json::to_string(&item).unwrap(), ITEM);
}

#[test]
fn an_older_index_still_parses() {
    // Written before items had timings and the pack's commit, and before the limit was kept, with
    // times as JavaScript writes whole numbers.
    let old = r#"{"version":1,"items":[{"id":"old","prompt":"old","seed":"7","width":256,"height":256,"steps":3,"schedule":"linear-shift","created":1600000000000,"bytes":1000}]}"#;
    let index = GalleryIndex::parse(old.as_bytes()).unwrap();
    let now = GalleryIndex::parse(INDEX.as_bytes()).unwrap();
    assert_eq!(index.items, now.items[..1]);
    assert_eq!(index.limit, now.limit);
    let old = &index.items[0];
    assert_eq!((old.image.prompt.as_str(), old.image.seed, old.image.steps), ("old", 7, 3));
    assert_eq!((old.created, old.timings.as_ref(), old.pack_commit.as_deref()), (1.6e12, None, None));
}

#[test]
fn pack_status_keeps_its_key_for_the_stored_forms_bytes() {
    // The Rust field is named for the re-blocked forms; the key the pages and tests read is as before.
    let status = imagine_core::api::PackStatus { reblocked_bytes: Some(854_387), ..Default::default() };
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["block32Bytes"], 854_387, "{json}");
    assert_eq!(serde_json::from_value::<imagine_core::api::PackStatus>(json).unwrap(), status);
}
