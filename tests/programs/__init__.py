"""Programs written the way users write them, used by the tests as they are."""
