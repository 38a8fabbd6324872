// Placeholder: written by its helper.
